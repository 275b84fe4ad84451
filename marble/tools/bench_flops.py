"""`marble bench flops`: counted cost of one micro-step per balancer row, and of whole runs.

    marble bench flops --preset bench_sd35m --json OUT.json [--md OUT.md]   # SD3.5M, ~minutes
    marble bench flops --preset tiny --json OUT.json

The transformer (the preset's architecture, base weights in `model.base_dtype`, the
preset's LoRA) lives on the meta device: shapes, no values, no memory. One micro-step per
row runs the trainer's own code (`run_micro_step`) under three counters: FLOPs
(`torch.utils.flop_counter.FlopCounterMode`: matmuls, convolutions, attention, and the
in-place matmuls it leaves at 0, `marble.tools.counting.flop_counter`; elementwise ops, the
loss head's included, are not FLOPs to it and are not counted), transformer
passes (forward with / without grad, backward) and live tensor bytes at the step's peak
(weights, adapters, .grad, activations; `marble.tools.counting.LiveTensorMemory`). Mixed
precision is emulated on meta by casting the inputs of the ops CUDA autocast runs in fp16
(matmul family, attention) and of its fp32 list (norms, softmax); attention runs through a
fused kernel as on a GPU (no stored attention matrix). Every figure is
deterministic; wall time is not measured here (see `marble bench step`).
Whole runs: each preset's cadence (solves, diagnostics) over its max_steps, priced with
these rows (`marble.balancers.cadence`), relative to a weighted-sum run.
"""

from __future__ import annotations

import dataclasses
import warnings

import importlib.util

import torch
from torch.overrides import TorchFunctionMode

from marble.balancers.advantage_level import ADVANTAGE_LEVEL
from marble.balancers.weightings import WEIGHTINGS

__all__ = ["FLOP_ROWS", "ZOO_ROWS", "default_rows", "bench_flops", "markdown_table", "MetaAutocast"]

# Row -> (method, balancer overrides, micro_index, prime the alpha cache). The rows of
# `marble bench step` plus diagnostics on each kind of step (diagnostics_every = 1).
_DIAG = {"diagnostics_every": 1}
_AMORTIZED = {"amortize_every": 10**9, "warmup_steps": 0}
_SOLVE = {"warmup_steps": 10**9}
FLOP_ROWS = {
    "weighted_sum": ("weighted_sum", {}, 1, False),
    "weighted_sum_diag": ("weighted_sum", _DIAG, 0, False),
    "marble": ("marble", _AMORTIZED, 1, True),
    "marble_diag": ("marble", {**_AMORTIZED, **_DIAG}, 0, True),
    "mgda": ("mgda", {}, 1, False),
    "mgda_diag": ("mgda", _DIAG, 0, False),
    "marble_recompute": ("marble", {**_SOLVE, "full_solve": "recompute"}, 1, False),
    "marble_recompute_diag": ("marble", {**_SOLVE, **_DIAG, "full_solve": "recompute"}, 0,
                              False),
    # issue 37: MGDA-UB on the output Gram (every micro-step; exact masking, which it requires)
    # and the norm-corrected amortized step (marble/balancers/fresh.py)
    "marble_output_gram": ("marble", {"gram_space": "output", "exact_masking": True,
                                      "cached_weights": "reference"}, 1, False),
    "marble_norm_corrected": ("marble", {**_AMORTIZED, "cached_weights": "norm_corrected"}, 1,
                              True),
    # issue 46: the exact fresh balance (a solve on every micro-step from per-sample gradients)
    "marble_exact": ("marble", {"fresh": "exact", "alpha_ema": 0.0}, 1, False),
    "marble_exact_diag": ("marble", {"fresh": "exact", "alpha_ema": 0.0, **_DIAG}, 0, False),
}
# The balancer zoo (marble/balancers/gramian.py): per torchjd weighting a full-solve row
# (a solve on every micro-step) above its amortized row (the cached weights, one backward),
# and the advantage-level balancers, whose step is the weighted sum's.
# Named as their presets (`zoo_<weighting>`): the bare names clash with the rows above.
# Exact masking, as every zoo preset sets it (a weighting off the simplex refuses the
# reference's r = 1/2 fill; the masking mode changes no counted FLOP): so the zoo's rows count
# on a preset that fills, bench_sd35m and the paper presets included.
ZOO_ROWS = {}
for _w in WEIGHTINGS:
    _zoo = {"weighting": _w, "exact_masking": True}
    ZOO_ROWS[f"zoo_{_w}_full"] = ("gramian", {**_SOLVE, **_zoo}, 1, False)
    ZOO_ROWS[f"zoo_{_w}"] = ("gramian", {**_AMORTIZED, **_zoo}, 1, True)
assert not set(ZOO_ROWS) & set(FLOP_ROWS), "a zoo row would replace a row above"
ZOO_ROWS.update({m: (m, {}, 1, False) for m in ADVANTAGE_LEVEL})
FLOP_ROWS.update(ZOO_ROWS)
PAPER_RUNS = ("rho_07", "rho_07_exact", "full_mgda", "fresh_exact", "weighted_sum", "equal_alpha")
TINY_RUNS = ("tiny", "tiny_mgda", "tiny_fresh_exact", "tiny_weighted_sum", "tiny_equal_alpha")
GIB = 2**30

_F = torch.nn.functional
_LOW = (_F.linear, torch.matmul, torch.mm, torch.bmm, torch.addmm, torch.baddbmm,
        _F.conv2d, torch.Tensor.matmul, torch.Tensor.__matmul__)
_FP32 = (_F.layer_norm, _F.group_norm, _F.softmax, torch.softmax, torch.Tensor.softmax,
         _F.log_softmax, _F.mse_loss)


def _fused_attention(q=None, k=None, v=None, attn_mask=None, dropout_p=0.0, is_causal=False,
                     scale=None, query=None, key=None, value=None, **_):
    """SDPA as a GPU runs it: a fused kernel that keeps no attention matrix for backward
    (on meta the dispatcher would pick the math path, which materialises B x H x S x S
    probabilities and inflates the live peak by tens of GiB at 512 px). Positional or
    keyword tensors (FLUX's attention passes query=, key=, value=)."""
    q, k, v = (q if q is not None else query), (k if k is not None else key), \
        (v if v is not None else value)
    return torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, attn_mask, True, dropout_p, is_causal, scale=scale)[0]


class MetaAutocast(TorchFunctionMode):
    """Autocast's casts on meta tensors (torch.autocast has no meta backend): floating
    inputs of the fp16-list ops cast to `dtype` (None: no autocast), of the fp32-list ops
    to fp32; attention through a fused kernel (`_fused_attention`)."""

    def __init__(self, dtype: torch.dtype | None):
        super().__init__()
        self.dtype = dtype

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _F.scaled_dot_product_attention:
            if self.dtype is not None:
                def low(a):
                    return a.to(self.dtype) if isinstance(a, torch.Tensor) else a
                args = tuple(low(a) for a in args)
                kwargs = {n: low(a) if n in ("query", "key", "value") else a
                          for n, a in kwargs.items()}
            return _fused_attention(*args, **kwargs)
        if self.dtype is None:
            return func(*args, **kwargs)
        target = self.dtype if func in _LOW else torch.float32 if func in _FP32 else None
        if target is not None:
            def cast(x):
                return x.to(target) if isinstance(x, torch.Tensor) and x.is_floating_point() \
                    else x
            args = torch.utils._pytree.tree_map(cast, args)
            kwargs = torch.utils._pytree.tree_map(cast, kwargs)
        return func(*args, **kwargs)


def meta_transformer(cfg, num_layers: int | None = None):
    """The preset's SD3 transformer on meta with its LoRA; (transformer, LoRA params)."""
    from diffusers import SD3Transformer2DModel

    from marble.models.lora import add_lora_adapters, trainable_lora_parameters
    from marble.models.tiny import SD35M_TRANSFORMER_CONFIG, TINY_TRANSFORMER_CONFIG
    from marble.runtime.precision import base_weight_dtype, upcast_lora_

    tiny = "tiny" in cfg.model.path
    config = dict(TINY_TRANSFORMER_CONFIG if tiny else SD35M_TRANSFORMER_CONFIG)
    if num_layers is not None:  # a narrower-in-depth model for quick checks (same widths)
        config["num_layers"] = num_layers
        config["dual_attention_layers"] = tuple(i for i in config["dual_attention_layers"]
                                                if i < num_layers)
    with torch.device("meta"):
        transformer = SD3Transformer2DModel(**config).to(base_weight_dtype(cfg.model.base_dtype))
        transformer.requires_grad_(False)
        m = cfg.model
        add_lora_adapters(transformer, rank=m.lora_rank, alpha=m.lora_alpha,
                          targets=m.lora_targets, seed=cfg.train.seed)
    upcast_lora_(transformer)
    return transformer, trainable_lora_parameters(transformer)


def meta_batch(cfg, transformer) -> dict:
    """A micro-batch of the preset's shapes on meta; the mask pattern of `bench step`."""
    from marble.maths.flow import forward_process

    b, k, tc = cfg.train.batch_size, len(cfg.rewards), transformer.config
    side = cfg.sampling.resolution // 8  # the SD3 VAE's x8
    shape = (b, tc.in_channels, side, side)
    adv = torch.zeros(b, k)
    for j in range(2, k):  # as bench step: specialists on every third sample
        adv[[i for i in range(b) if (i + j) % 3 != 0], j] = float("nan")
    meta = {"device": "meta"}
    x0, eps = torch.empty(shape, **meta), torch.empty(shape, **meta)
    sigma = torch.empty(b, **meta)
    return {"x0": x0, "x_t": forward_process(x0, eps, sigma), "sigma": sigma,
            "embeds": torch.empty(b, 77 + cfg.model.max_sequence_length,
                                  tc.joint_attention_dim, **meta),
            "pooled": torch.empty(b, tc.pooled_projection_dim, **meta),
            "adv": adv.to("meta"), "avg_adv": torch.empty(b, **meta),
            "present": tuple(bool(x) for x in torch.isfinite(adv).any(0).tolist())}


def _balancer(cfg, row: str):
    from marble.balancers import build_balancer

    method, overrides, _, prime = FLOP_ROWS[row]
    bcfg = dataclasses.replace(cfg.balancer, **{"method": method, "diagnostics_every": 0,
                                                 **overrides})
    bal = build_balancer(bcfg, cfg.reward_names)
    if prime:  # the balancer's own state format (a zoo row's names its weighting too)
        k = len(cfg.reward_names)
        state = {**bal.state_dict(), "alpha_cache": [1.0 / k] * k, "last_full": 0,
                 "last_alpha": None}
        if "cached_norms" in state:  # norm-corrected: the norms of the solve it primes
            state.update(cached_norms=[1.0] * k, cached_mean_norm=1.0)
        bal.load_state_dict(state)
    return bal


def default_runs(tiny: bool, rows) -> tuple:
    """The presets whose whole-run overhead is priced: the current balancers', and the
    zoo's whose rows were counted."""
    base = TINY_RUNS if tiny else PAPER_RUNS
    zoo = [("tiny_zoo_" if tiny else "zoo_") + w for w in WEIGHTINGS if f"zoo_{w}" in rows]
    zoo += [("tiny_" if tiny else "") + m for m in ADVANTAGE_LEVEL if m in rows]
    return (*base, *zoo)


def default_rows() -> tuple:
    """Every row; the torchjd ones only where torchjd is installed (the `zoo` extra)."""
    zoo = importlib.util.find_spec("torchjd") is not None
    return tuple(r for r in FLOP_ROWS if zoo or FLOP_ROWS[r][0] != "gramian")


class _Precision:
    """`run_micro_step`'s autocast factory on meta (no GradScaler: its scale is a value)."""

    scaler = None

    def __init__(self, mixed_precision: str):
        from marble.runtime.precision import DTYPES

        self.dtype = None if mixed_precision == "no" else DTYPES[mixed_precision]

    def __call__(self):
        return MetaAutocast(self.dtype)


def count_row(cfg, transformer, params, batch, row: str) -> dict:
    """FLOPs, passes and live-tensor peak of one micro-step of `row`."""

    from marble.tools.micro_step_call import one_micro_step
    from marble.tools.counting import LiveTensorMemory, PassCounter, flop_counter

    for p in params:
        p.grad = None
    bal = _balancer(cfg, row)
    memory, passes = LiveTensorMemory(), PassCounter(transformer)
    memory.track([*transformer.parameters(), *transformer.buffers(),
                  *(v for v in batch.values() if isinstance(v, torch.Tensor))])
    start = memory.current
    pipe = type("Pipe", (), {"transformer": transformer})
    try:
        with flop_counter() as flops, memory, warnings.catch_warnings():
            # PassCounter's hook on a frozen base: torch notes that no input needs a grad
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            one_micro_step(pipe, cfg, batch, bal, params, _Precision(cfg.model.mixed_precision),
                           micro_index=FLOP_ROWS[row][2])
    finally:
        passes.close()
    return {"flops": flops.get_total_flops(), **passes.counts(),
            "peak_live_gib": memory.peak / GIB, "start_live_gib": start / GIB,
            "peak_over_start_gib": (memory.peak - start) / GIB}


def bench_flops(cfg, rows: tuple | None = None, runs: tuple | None = None,
                num_layers: int | None = None) -> dict:
    """Every row's counts (ratios to weighted_sum) and each run's whole-run overhead."""
    from marble.config import load_config
    from marble.balancers.cadence import run_overhead

    rows = default_rows() if rows is None else rows
    if "weighted_sum" not in rows or set(rows) - set(FLOP_ROWS):
        raise ValueError(f"bench flops rows {list(rows)}: pick from {list(FLOP_ROWS)}, "
                         "weighted_sum included (the ratios' base)")
    transformer, params = meta_transformer(cfg, num_layers)
    batch = meta_batch(cfg, transformer)
    counted = {row: count_row(cfg, transformer, params, batch, row) for row in rows}
    ws = counted["weighted_sum"]
    for r in counted.values():
        r["flops_ratio"] = r["flops"] / ws["flops"]
        r["peak_ratio"] = r["peak_live_gib"] / ws["peak_live_gib"]
    tiny = "tiny" in cfg.model.path
    runs = runs if runs is not None else default_runs(tiny, rows)
    flops, per_run, unpriced = {row: r["flops"] for row, r in counted.items()}, {}, {}
    for name in runs:  # a run whose kinds of micro-step were not all counted is listed
        try:
            per_run[name] = run_overhead(load_config(name), flops)
        except KeyError as exc:
            unpriced[name] = str(exc.args[0])
    n_base = sum(p.numel() for n, p in transformer.named_parameters() if "lora_" not in n)
    return {
        "preset": cfg.preset, "rows": counted, "runs": per_run, "runs_unpriced": unpriced,
        "base_params": n_base, "lora_params": sum(p.numel() for p in params),
        "num_layers": transformer.config.num_layers, "base_dtype": cfg.model.base_dtype,
        "mixed_precision": cfg.model.mixed_precision, "batch_size": cfg.train.batch_size,
        "resolution": cfg.sampling.resolution, "num_rewards": len(cfg.rewards),
        "lora_rank": cfg.model.lora_rank, "torch": torch.__version__,
        "notes": __doc__.split("\n\n", 2)[2].strip(),
    }


def markdown_table(res: dict) -> str:
    """The rows and runs as markdown tables (the report's cost table)."""
    head = (f"SD3 transformer: {res['base_params'] / 1e9:.3f} B base parameters "
            f"({res['base_dtype']}, {res['num_layers']} layers), LoRA rank {res['lora_rank']} "
            f"({res['lora_params'] / 1e6:.2f} M), batch {res['batch_size']}, "
            f"{res['resolution']} px, K = {res['num_rewards']}, autocast "
            f"{res['mixed_precision']}; preset `{res['preset']}`.")
    lines = [head, "", "| row | TFLOP | x weighted_sum | fwd grad | fwd no-grad | backward "
             "| live peak GiB | x weighted_sum |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row, r in res["rows"].items():
        lines.append(f"| {row} | {r['flops'] / 1e12:.4g} | {r['flops_ratio']:.4f} | "
                     f"{r['forward_grad']} | {r['forward_no_grad']} | {r['backward']} | "
                     f"{r['peak_live_gib']:.2f} | {r['peak_ratio']:.4f} |")
    if res["runs"]:
        lines += ["", "| run | steps | micro-steps | full solves | diagnostic micro-steps "
                  "| whole-run FLOPs x weighted_sum | overhead |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for name, r in res["runs"].items():
            lines.append(f"| {name} ({r['method']}, {r['full_solve']}) | {r['max_steps']} | "
                         f"{r['micro_steps']} | {r['full_solves']} | "
                         f"{r['diagnostic_micro_steps']} | {r['ratio']:.4f} | "
                         f"{100 * r['overhead']:+.3f}% |")
    return "\n".join(lines) + "\n"
