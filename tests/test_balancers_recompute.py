"""Balancers: the one-evaluation amortized loss, full solves by recompute (no retained graph),
the shared strategy contract, and two gloo ranks solving on their mean gradients."""

import dataclasses

import numpy as np
import pytest
from extras import needs
import torch
from balancer_toy import NAMES, Toy, _adv, _kl_grad, _masked_reward_grads

import marble.balancers as balancers_mod
from marble.balancers import build_balancer
from marble.config import BalancerConfig
from marble.config_balancers import balancer_descriptor

# ---------------------------------------------------------------- one evaluation, recompute


@pytest.mark.parametrize("exact", [True, False])
def test_amortized_step_evaluates_the_loss_head_once(exact):
    toy, adv = Toy(30), _adv(31)
    adv[0, 0] = adv[4, 2] = float("nan")
    alpha = [0.2, 0.5, 0.3]
    bal = build_balancer(BalancerConfig(method="equal_alpha", fixed_alphas=alpha,
                                        exact_masking=exact, diagnostics_every=0), NAMES)
    toy.head_calls = 0
    got, metrics = toy.applied_grad(bal, adv)
    assert toy.head_calls == 1 and metrics["full_solve"] == 0.0
    if exact:  # and it is still sum_k alpha_k g_k of the masked losses
        g = _masked_reward_grads(toy, adv)
        expected = sum(a * gk for a, gk in zip(alpha, g)) + _kl_grad(toy, adv)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def _run(method, full_solve, adv, global_step=0, micro_index=0, diagnostics_every=1, **kw):
    toy = Toy(40, kl_weight=0.3, dtype=torch.float64)
    cfg = BalancerConfig(method=method, full_solve=full_solve,
                         diagnostics_every=diagnostics_every, **kw)
    bal = build_balancer(cfg, NAMES)
    if method == "marble" and kw.get("warmup_steps") == 0:
        bal.load_state_dict({"method": "marble", "reward_names": NAMES, "alpha_cache":
                             [0.5, 0.2, 0.3], "last_full": 0, "last_alpha": None})
    toy.forwards = 0
    grad, metrics = toy.applied_grad(bal, adv, global_step=global_step, micro_index=micro_index)
    return grad, metrics, toy.forwards


@pytest.mark.parametrize("case", [
    dict(method="mgda"),  # full solve, cosines + weighted-sum direction on micro-step 0
    dict(method="mgda", micro_index=1),  # and on every other micro-step of a diagnostic step
    dict(method="mgda", diagnostics_every=0),  # the reference's full solve
    dict(method="marble", warmup_steps=0, amortize_every=100),  # amortized + diagnostics
])
def test_recompute_gives_the_retained_graph_gradients(case):
    adv = _adv(41)
    adv[1, 0] = adv[5, 2] = float("nan")
    g_retain, m_retain, f_retain = _run(adv=adv, full_solve="retain", **case)
    g_rec, m_rec, f_rec = _run(adv=adv, full_solve="recompute", **case)
    torch.testing.assert_close(g_rec, g_retain, rtol=1e-6, atol=1e-12)
    assert m_rec.keys() == m_retain.keys()
    for key, value in m_retain.items():
        assert m_rec[key] == pytest.approx(value, rel=1e-6, abs=1e-12, nan_ok=True), key
    assert f_retain == 1
    with_ws = "cos_ws_min" in m_retain and case["method"] != "weighted_sum"
    # one forward + backward per reward, KL and (when logged) the weighted-sum direction; an
    # amortized step's training backward shares the micro-step's own forward with the first
    # reward pass (its graph is retained for it: no extra forward)
    assert f_rec == len(NAMES) + 1 + int(with_ws)


def test_recompute_keeps_no_graph_alive():
    toy, adv = Toy(42, kl_weight=0.3), _adv(43)
    bal = build_balancer(BalancerConfig(method="mgda", full_solve="recompute"), NAMES)
    step = toy.step(adv)
    bal.backward(step)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        torch.autograd.grad(step.kl, toy.params)  # the micro-step's own graph was freed
    retained = build_balancer(BalancerConfig(method="mgda"), NAMES)
    step = toy.step(adv)
    retained.backward(step)
    torch.autograd.grad(step.kl, toy.params)  # the reference keeps it


def test_recompute_without_a_callable_is_a_clear_error():
    toy, adv = Toy(44), _adv(45)
    step = dataclasses.replace(toy.step(adv), recompute=None)
    bal = build_balancer(BalancerConfig(method="mgda", full_solve="recompute"), NAMES)
    with pytest.raises(ValueError, match="full_solve = recompute needs MicroStep.recompute"):
        bal.backward(step)


def test_diagnostics_every_zero_turns_every_diagnostic_off():
    toy, adv = Toy(46), _adv(47)
    for method in ("weighted_sum", "mgda"):
        bal = build_balancer(BalancerConfig(method=method, diagnostics_every=0), NAMES)
        _, m = toy.applied_grad(bal, adv, global_step=0, micro_index=0)
        assert not [k for k in m if k.startswith(("cos", "anti_aligned"))], method


@pytest.mark.parametrize("method", balancers_mod.METHODS)
def test_every_strategy_shares_one_contract(method):
    """Every registered method builds to a Balancer; the zoo's needs torchjd, which is a
    failure, not a skip, where the `zoo` extra was installed (tests/extras.py)."""
    zoo = {}
    if balancer_descriptor(method).cadence == "zoo":
        needs("torchjd.aggregation", "zoo")
        zoo = {"weighting": "mgda"}  # the zoo names its weighting
    bal = build_balancer(BalancerConfig(method=method, **zoo), NAMES)
    assert bal.method == method and isinstance(bal, balancers_mod.Balancer)


def test_old_state_loads():
    # A checkpoint written before the strategies existed (same keys) still loads.
    old = {"method": "marble", "reward_names": NAMES, "alpha_cache": [0.2, 0.3, 0.5],
           "last_full": 7, "last_alpha": [0.1, 0.4, 0.5], "solver_fallbacks": 2}
    bal = build_balancer(BalancerConfig(method="marble", amortize_every=10), NAMES)
    bal.load_state_dict(old)
    assert bal.state_dict() == old
    assert not bal.wants_full_solve(Toy(0).step(_adv(0), global_step=8))
    build_balancer(BalancerConfig(), NAMES, weights=[1.0, 1.0, 1.0])  # all ones: accepted
    for weights in ([1.0, 2.0, 1.0], [2.0, 2.0, 2.0]):  # would scale or tilt the direction
        with pytest.raises(ValueError, match="QP weights are not supported"):
            build_balancer(BalancerConfig(), NAMES, weights=weights)


def test_reward_absent_from_batch_logs_nan_loss_not_zero():
    toy, adv = Toy(48), _adv(49)
    adv[:, 1] = float("nan")
    _, m = toy.applied_grad(build_balancer(BalancerConfig(method="mgda"), NAMES), adv)
    assert np.isnan(m["loss/policy_r1"]) and np.isfinite(m["loss/policy"])


def test_config_keys_of_the_balancer_are_checked():
    from marble.config import ConfigError, load_config

    assert load_config("tiny").balancer.full_solve == "retain"  # the reference's behaviour
    cfg = load_config("tiny", overrides=["balancer.full_solve=recompute"])
    assert cfg.balancer.full_solve == "recompute"
    with pytest.raises(ConfigError, match="balancer.full_solve"):
        load_config("tiny", overrides=["balancer.full_solve=sometimes"])
    with pytest.raises(ConfigError, match="diagnostics_every"):
        load_config("tiny", overrides=["balancer.diagnostics_every=-1"])


# ---------------------------------------------------------------- two ranks


def _rank_toy(rank):
    """Same model on every rank, a different micro-batch per rank."""
    toy = Toy(60 + rank, kl_weight=0.3, dtype=torch.float64)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in toy.params:
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64))
    adv = _adv(70 + rank).double()
    adv[rank, 0] = adv[3, 2] = float("nan")
    return toy, adv


def _gloo_worker(rank: int, port: int, out_dir: str) -> None:
    import os

    from marble.runtime import distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
                      RANK=str(rank), LOCAL_RANK=str(rank))
    dist.init_distributed("cpu")
    toy, adv = _rank_toy(rank)
    out = {}
    for mode in ("retain", "recompute"):
        bal = build_balancer(BalancerConfig(method="mgda", full_solve=mode), NAMES)
        out[mode], m = toy.applied_grad(bal, adv, micro_index=0)
        out[f"{mode}_alpha"] = torch.tensor([m[f"alpha/{n}"] for n in NAMES],
                                            dtype=torch.float64)
    torch.save(out, os.path.join(out_dir, f"r{rank}.pt"))
    dist.barrier()
    dist.cleanup()


def test_two_ranks_solve_on_the_mean_of_their_gradients(tmp_path):
    """Per-reward and KL gradients are averaged over ranks (marble.runtime.distributed) before the
    QP: both ranks apply the same direction, the one a single process gets from the mean."""
    import socket

    import torch.multiprocessing as mp

    from marble.maths.qp import min_norm_weights

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_gloo_worker, args=(port, str(tmp_path)), nprocs=2, join=True)
    got = [torch.load(tmp_path / f"r{r}.pt", weights_only=True) for r in (0, 1)]
    toys = [_rank_toy(r) for r in (0, 1)]
    g = [sum(gr) / 2 for gr in zip(*(_masked_reward_grads(t, a) for t, a in toys))]
    kl = sum(_kl_grad(t, a) for t, a in toys) / 2
    norms = np.array([float(gk.norm()) for gk in g])
    gram = np.array([[float(a @ b) / (na * nb) for b, nb in zip(g, norms)]
                     for a, na in zip(g, norms)])
    alpha = min_norm_weights(gram)
    expected = sum(float(a) * gk / n for a, gk, n in zip(alpha, g, norms)) * norms.mean() + kl
    for rank in (0, 1):
        for mode in ("retain", "recompute"):
            torch.testing.assert_close(got[rank][mode], expected, rtol=1e-6, atol=1e-9)
            # flat gradients are float32 (as the reference): alpha agrees to ~1e-7
            np.testing.assert_allclose(got[rank][f"{mode}_alpha"].numpy(), alpha, atol=1e-6)


def test_full_solve_weighted_sum_diagnostic_only_on_the_cadence():
    """mgda's extra weighted-sum pass runs on the first micro-step of every
    `diagnostics_every`-th step only, like every other diagnostic (it used to run on
    micro-step 0 of every step: one backward more per optimizer step)."""
    toy, adv = Toy(48, kl_weight=0.3), _adv(49)
    bal = build_balancer(BalancerConfig(method="mgda", diagnostics_every=10, full_solve="recompute"),
                         NAMES)
    seen = {}
    for global_step in (3, 10):
        before = toy.forwards
        _, m = toy.applied_grad(bal, adv, global_step=global_step, micro_index=0)
        seen[global_step] = ("cos_ws_min" in m, toy.forwards - before, "cos_min" in m)
    # recompute: one forward per pass (K rewards + KL, + the weighted sum on the cadence)
    assert seen[3] == (False, len(NAMES) + 1, True)  # cosines of the solve stay (free)
    assert seen[10] == (True, len(NAMES) + 2, True)
