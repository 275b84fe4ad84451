"""The optimizer update under fp16 GradScaler / bf16: found-inf over ranks, skip, scale.

The 2-process tests run the real `optimizer_update` in a gloo group (as the trainer
does after its micro-steps) with an overflow on rank 0 only.
"""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from marble.runtime import distributed as dist
from marble.runtime.precision import make_precision, optimizer_update


def _setup(mixed_precision: str, rank: int = 0):
    torch.manual_seed(0)  # same initial weights on every rank
    params = [torch.nn.Parameter(torch.randn(3, 2)), torch.nn.Parameter(torch.randn(4))]
    opt = torch.optim.AdamW(params, lr=0.1)
    precision = make_precision(mixed_precision, torch.device("cpu"))
    # A "micro-step": backward of the (scaled) loss, as the balancers do it.
    loss = sum((p * (rank + 1.0)).square().sum() for p in params)
    if precision.scaler is not None:
        loss = precision.scaler.scale(loss)
    loss.backward()
    return params, opt, precision


def test_fp16_scaler_steps_and_logs_unscaled_norm():
    params, opt, precision = _setup("fp16")
    before = [p.detach().clone() for p in params]
    expected = torch.cat([(2 * p.detach()).flatten() for p in params]).norm()
    out = optimizer_update(params, opt, precision, max_grad_norm=1e9)
    assert out["skipped_step"] == 0.0 and out["loss_scale"] == 65536.0
    assert out["grad_norm"] == pytest.approx(float(expected), rel=1e-5)  # not x65536
    assert not any(torch.equal(b, p) for b, p in zip(before, params))
    assert all(p.grad is None for p in params)


def test_hidden_overflow_skips_and_backs_off():
    """Entries a full solve zeroed (finite .grad) still skip the step and halve the scale."""
    params, opt, precision = _setup("fp16")
    before = [p.detach().clone() for p in params]
    out = optimizer_update(params, opt, precision, max_grad_norm=1.0, hidden_nonfinite=3.0)
    assert out["skipped_step"] == 1.0
    assert precision.scaler.get_scale() == 32768.0
    assert all(torch.equal(b, p) for b, p in zip(before, params))
    assert not opt.state  # AdamW never stepped: no moments, no weight decay


def test_bf16_has_no_scaler_and_skips_nonfinite():
    params, opt, precision = _setup("bf16")
    assert precision.scaler is None
    params[0].grad[0, 0] = float("nan")
    before = [p.detach().clone() for p in params]
    out = optimizer_update(params, opt, precision, max_grad_norm=1.0)
    assert out["skipped_step"] == 1.0 and out["loss_scale"] == 1.0
    assert all(torch.equal(b, p) for b, p in zip(before, params))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SCENARIOS = [("fp16", "visible"), ("fp16", "hidden"), ("bf16", "hidden")]


def _scenario(rank: int, mixed_precision: str, kind: str) -> dict:
    params, opt, precision = _setup(mixed_precision, rank)
    hidden = 0.0
    if rank == 0 and kind == "visible":
        params[1].grad[2] = float("inf")  # an overflow in this rank's backward
    elif rank == 0 and kind == "hidden":
        hidden = 5.0  # a full solve zeroed 5 entries on this rank only
    before = [p.detach().clone() for p in params]
    out = optimizer_update(params, opt, precision, max_grad_norm=1.0, hidden_nonfinite=hidden)
    skipped_unchanged = all(torch.equal(b, p) for b, p in zip(before, params))
    # The next step, without overflow, must step on both ranks with the same scale.
    loss = sum(p.square().sum() for p in params)
    (precision.scaler.scale(loss) if precision.scaler else loss).backward()
    scale_2 = precision.scaler.get_scale() if precision.scaler else 1.0
    out2 = optimizer_update(params, opt, precision, max_grad_norm=1.0)
    return {"out": out, "out2": out2, "scale_2": scale_2, "skipped_unchanged": skipped_unchanged,
            "params": [p.detach().clone() for p in params], "before": before}


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
                      RANK=str(rank), LOCAL_RANK=str(rank))
    dist.init_distributed("cpu")
    try:
        results = [_scenario(rank, m, k) for m, k in SCENARIOS]  # one process group for all
        torch.save(results, os.path.join(out_dir, f"r{rank}.pt"))
    finally:
        dist.cleanup()


def test_overflow_on_one_rank_skips_on_both(tmp_path):
    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    res0 = torch.load(tmp_path / "r0.pt", weights_only=True)
    res1 = torch.load(tmp_path / "r1.pt", weights_only=True)
    for (mixed_precision, kind), r0, r1 in zip(SCENARIOS, res0, res1):
        case = f"{mixed_precision}/{kind}"
        for r in (r0, r1):
            assert r["out"]["skipped_step"] == 1.0, f"{case}: a rank stepped through an overflow"
            assert r["skipped_unchanged"], case
            assert r["out2"]["skipped_step"] == 0.0, case
            assert all(torch.isfinite(p).all() for p in r["params"]), case
        # Same scale after the backoff on both ranks (fp16: 65536 -> 32768), equal weights.
        assert r0["scale_2"] == r1["scale_2"] == (32768.0 if mixed_precision == "fp16" else 1.0)
        for a, b in zip(r0["params"], r1["params"]):
            assert torch.equal(a, b), case
        for a, b in zip(r0["params"], r0["before"]):
            assert not torch.equal(a, b), case  # the second (clean) step did move them


def test_reference_precision_defaults_and_tf32():
    from marble.config import load_config, to_dict
    from marble.runtime.precision import enable_tf32

    paper = load_config("rho_07").model
    assert (paper.mixed_precision, paper.base_dtype, paper.allow_tf32) == ("fp16", "fp32", True)
    tiny, fp16 = to_dict(load_config("tiny")), to_dict(load_config("tiny_fp16"))
    assert fp16["model"].pop("mixed_precision") == "fp16"
    tiny["model"].pop("mixed_precision")
    fp16.pop("preset"), tiny.pop("preset")
    assert fp16 == tiny
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        enable_tf32(torch.device("cpu"))
        assert not torch.backends.cuda.matmul.allow_tf32
        enable_tf32(torch.device("cuda", 0))
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
