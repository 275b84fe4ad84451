"""Balancers on a tiny differentiable toy: amortization identity, masks, schedule, state."""

import dataclasses

import numpy as np
import pytest
import torch

import marble.balancers as balancers_mod
import marble.balancers.solve as solve_mod
from marble.balancers import MicroStep, build_balancer, reward_losses
from marble.config import BalancerConfig
from marble.nft import kl_loss, nft_loss_from_terms, nft_terms

NAMES = ["r0", "r1", "r2"]
BETA, CLIP, SCALE = 0.1, 5.0, 0.25


class Toy:
    """v_theta = 1x1 conv of x_t; v_old, v_ref, x0 fixed random tensors."""

    def __init__(self, seed=0, batch=6, kl_weight=1e-2, dtype=torch.float32):
        gen = torch.Generator().manual_seed(seed)
        self.model = torch.nn.Conv2d(2, 2, 1).to(dtype)
        with torch.no_grad():
            for p in self.model.parameters():
                p.copy_(torch.randn(p.shape, generator=gen))
        shape = (batch, 2, 2, 2)
        self.x0, noise, self.v_old, self.v_ref = (torch.randn(shape, generator=gen).to(dtype)
                                                  for _ in range(4))
        self.t = (torch.rand(batch, generator=gen) * 0.7 + 0.2).to(dtype)
        tb = self.t.view(-1, 1, 1, 1)
        self.x_t = (1 - tb) * self.x0 + tb * noise
        self.kl_weight = kl_weight
        self.params = list(self.model.parameters())
        self.forwards = 0  # v_theta forwards
        self.head_calls = 0  # evaluations of the loss head (loss_per_sample)

    def step(self, adv, avg=None, global_step=0, micro_index=0):
        self.forwards += 1
        v_theta = self.model(self.x_t)
        l_pos, l_neg = nft_terms(v_theta, self.v_old, self.x0, self.x_t, self.t, BETA)
        kl = self.kl_weight * kl_loss(v_theta, self.v_ref).mean()
        if avg is None:
            avg = torch.nanmean(adv, dim=1)

        def head(r):
            self.head_calls += 1
            return nft_loss_from_terms(l_pos, l_neg, r, BETA, CLIP)

        return MicroStep(
            loss_per_sample=head, kl=kl, advantages=adv, avg_advantage=avg, scale=SCALE,
            params=self.params, global_step=global_step, micro_index=micro_index, adv_clip=CLIP,
            recompute=lambda: self.step(adv, avg, global_step, micro_index),
        )

    def flat_grad(self, loss_fn, adv, avg=None):
        """Reference gradient of loss_fn(step) computed on its own fresh forward."""
        step = self.step(adv, avg)
        grads = torch.autograd.grad(loss_fn(step), self.params)
        return torch.cat([g.reshape(-1) for g in grads])

    def applied_grad(self, balancer, adv, avg=None, **kw):
        for p in self.params:
            p.grad = None
        metrics = balancer.backward(self.step(adv, avg, **kw))
        return torch.cat([p.grad.reshape(-1) for p in self.params]), metrics


def _adv(seed, batch=6, k=3, low=-2.0, high=2.0):
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(batch, k, generator=gen) * (high - low) + low


def _masked_reward_grads(toy, adv):
    """g_k of scale * masked mean loss, written out independently of the balancer."""
    out = []
    for k in range(adv.shape[1]):
        def loss_k(step, k=k):
            col = step.advantages[:, k]
            valid = ~torch.isnan(col)
            r = (torch.nan_to_num(col).clamp(-CLIP, CLIP) / (2 * CLIP) + 0.5)
            per = step.loss_per_sample(r)
            return SCALE * per[valid].sum() / max(int(valid.sum()), 1)
        out.append(toy.flat_grad(loss_k, adv))
    return out


def _kl_grad(toy, adv):
    return toy.flat_grad(lambda s: SCALE * s.kl, adv)


@pytest.mark.parametrize("exact", [True, False])
def test_amortization_identity_without_masks(exact):
    toy, adv = Toy(0), _adv(1)
    alpha = [0.2, 0.5, 0.3]
    bal = build_balancer(BalancerConfig(method="equal_alpha", fixed_alphas=alpha,
                                        exact_masking=exact), NAMES)
    got, metrics = toy.applied_grad(bal, adv)
    g = _masked_reward_grads(toy, adv)
    expected = sum(a * gk for a, gk in zip(alpha, g)) + _kl_grad(toy, adv)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert metrics["full_solve"] == 0.0 and metrics["alpha/r1"] == pytest.approx(0.5)


def test_marble_amortized_step_uses_fresh_cached_alpha():
    toy, adv = Toy(2), _adv(3)
    bal = build_balancer(BalancerConfig(method="marble", warmup_steps=1, amortize_every=10),
                         NAMES)
    toy.applied_grad(bal, adv, global_step=0)  # full solve fills the cache
    alpha = bal.alpha_cache.copy()
    got, metrics = toy.applied_grad(bal, adv, global_step=1)
    assert metrics["full_solve"] == 0.0 and metrics["alpha_staleness"] == 1.0
    g = _masked_reward_grads(toy, adv)
    expected = sum(float(a) * gk for a, gk in zip(alpha, g)) + _kl_grad(toy, adv)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_masked_amortized_step_is_exact_and_reference_fill_differs():
    toy, adv = Toy(4), _adv(5)
    adv[0, 0] = adv[2, 0] = adv[1, 2] = float("nan")
    adv[3, :] = float("nan")  # a sample no reward applies to
    alpha = [0.3, 0.3, 0.4]
    exact = build_balancer(BalancerConfig(method="equal_alpha", fixed_alphas=alpha), NAMES)
    got, metrics = toy.applied_grad(exact, adv)
    g = _masked_reward_grads(toy, adv)
    expected = sum(a * gk for a, gk in zip(alpha, g)) + _kl_grad(toy, adv)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert np.isfinite(metrics["loss/policy"])
    ref = build_balancer(BalancerConfig(method="equal_alpha", fixed_alphas=alpha,
                                        exact_masking=False), NAMES)
    got_ref, _ = toy.applied_grad(ref, adv)
    assert (got_ref - expected).norm() > 1e-4 * expected.norm()


def test_weighted_sum_excludes_rows_without_reward():
    toy, adv = Toy(6), _adv(7)
    avg = torch.tensor([0.5, -1.0, float("nan"), 2.0, 0.0, -0.3])
    bal = build_balancer(BalancerConfig(method="weighted_sum", diagnostics_every=1000), NAMES)
    got, metrics = toy.applied_grad(bal, adv, avg, global_step=1)

    def loss(step):  # row 2 (NaN mean reward) is left out of the mean: 5 rows remain
        keep = [0, 1, 3, 4, 5]
        per = step.loss_per_sample(torch.nan_to_num(step.avg_advantage) / (2 * CLIP) + 0.5)
        return SCALE * (per[keep].mean() + step.kl)

    torch.testing.assert_close(got, toy.flat_grad(loss, adv, avg), rtol=1e-5, atol=1e-6)
    assert "cos_min" not in metrics  # no diagnostics off schedule
    assert "alpha/r0" not in metrics


def _cos(a, b):
    a, b = a.double(), b.double()
    return float(a @ b / (a.norm() * b.norm()))


def test_mgda_full_solve_equalises_cosines_and_rescales():
    toy, adv = Toy(8, kl_weight=0.0), _adv(9)
    bal = build_balancer(BalancerConfig(method="mgda"), NAMES)
    got, metrics = toy.applied_grad(bal, adv, global_step=3, micro_index=2)
    assert metrics["full_solve"] == 1.0
    g = _masked_reward_grads(toy, adv)
    alpha = np.array([metrics[f"alpha/{n}"] for n in NAMES])
    assert alpha.sum() == pytest.approx(1.0) and np.all(alpha >= 0)
    cos = np.array([_cos(got, gk) for gk in g])
    active = alpha > 1e-8
    assert active.sum() >= 2
    np.testing.assert_allclose(cos[active], cos[active][0], atol=1e-5)
    assert np.all(cos >= cos[active][0] - 1e-5)
    np.testing.assert_allclose([metrics[f"cos/{n}"] for n in NAMES], cos, atol=1e-5)
    norms = np.array([float(gk.norm()) for gk in g])
    unit = sum(float(a) * gk / n for a, gk, n in zip(alpha, g, norms))
    torch.testing.assert_close(got, unit * norms.mean(), rtol=1e-4, atol=1e-6)
    assert metrics["cos_var"] == pytest.approx(np.var(cos), abs=1e-8)
    assert metrics["anti_aligned"] == 0.0


def test_full_solve_adds_kl_outside_qp_and_accumulates():
    toy, adv = Toy(10, kl_weight=0.5), _adv(11)
    bal = build_balancer(BalancerConfig(method="mgda"), NAMES)
    first, _ = toy.applied_grad(bal, adv)
    no_kl = Toy(10, kl_weight=0.0)
    bal2 = build_balancer(BalancerConfig(method="mgda"), NAMES)
    policy_only, _ = no_kl.applied_grad(bal2, adv)
    torch.testing.assert_close(first, policy_only + _kl_grad(toy, adv), rtol=1e-5, atol=1e-6)
    bal.backward(toy.step(adv))  # p.grad already holds `first`: a second call adds to it
    total = torch.cat([p.grad.reshape(-1) for p in toy.params])
    torch.testing.assert_close(total, 2 * first, rtol=1e-5, atol=1e-6)


def test_marble_schedule_and_alpha_ema_by_hand():
    toy = Toy(12)
    bal = build_balancer(BalancerConfig(method="marble", warmup_steps=1, amortize_every=3,
                                        alpha_ema=0.7, diagnostics_every=1000), NAMES)
    plan = [(0, 0, 1), (0, 1, 1), (1, 0, 0), (1, 1, 0), (2, 0, 0), (3, 0, 1), (3, 1, 0),
            (4, 0, 0), (5, 1, 0), (6, 0, 1)]
    solved = []
    for i, (gs, micro, full) in enumerate(plan):
        _, m = toy.applied_grad(bal, _adv(100 + i), global_step=gs, micro_index=micro)
        assert m["full_solve"] == full, (gs, micro)
        if full:
            solved.append(np.array([m[f"alpha/{n}"] for n in NAMES]))
        if len(solved) == 1 and full:
            np.testing.assert_allclose(bal.alpha_cache, solved[0])
        if len(solved) == 2 and full and micro == 1:
            np.testing.assert_allclose(bal.alpha_cache, 0.7 * solved[0] + 0.3 * solved[1])
        if not full:
            np.testing.assert_allclose([m[f"alpha/{n}"] for n in NAMES], bal.alpha_cache)
    assert len(solved) == 4
    assert bal.last_full == 6 and not np.allclose(solved[0], solved[1])


def test_equal_alpha_never_solves_and_defaults_to_uniform(monkeypatch):
    monkeypatch.setattr(solve_mod, "min_norm_weights", lambda g: pytest.fail("solved"))
    toy = Toy(13)
    bal = build_balancer(BalancerConfig(method="equal_alpha", diagnostics_every=2), NAMES)
    for gs in range(4):
        _, m = toy.applied_grad(bal, _adv(gs), global_step=gs)
        assert m["full_solve"] == 0.0 and m["alpha/r2"] == pytest.approx(1 / 3)
        assert ("cos_min" in m) == (gs % 2 == 0)


def test_diagnostics_on_weighted_sum_match_independent_cosines():
    toy, adv = Toy(14), _adv(15)
    bal = build_balancer(BalancerConfig(method="weighted_sum", diagnostics_every=5), NAMES)
    got, m = toy.applied_grad(bal, adv, global_step=10, micro_index=0)
    g = _masked_reward_grads(toy, adv)
    d = got - _kl_grad(toy, adv)  # the applied policy direction
    cos = np.array([_cos(d, gk) for gk in g])
    np.testing.assert_allclose([m[f"cos/{n}"] for n in NAMES], cos, atol=1e-5)
    np.testing.assert_allclose([m[f"cos_ws/{n}"] for n in NAMES], cos, atol=1e-5)
    assert m["cos_min"] == pytest.approx(cos.min(), abs=1e-5)
    assert m["anti_aligned"] == float(cos.min() < 0)
    np.testing.assert_allclose([m[f"grad_norm/{n}"] for n in NAMES],
                               [float(gk.norm()) for gk in g], rtol=1e-5)


def test_reward_with_no_valid_sample_gets_zero_alpha_and_nan_cosine():
    toy, adv = Toy(16), _adv(17)
    adv[:, 1] = float("nan")
    bal = build_balancer(BalancerConfig(method="marble"), NAMES)
    _, m = toy.applied_grad(bal, adv)
    assert m["alpha/r1"] == 0.0 and m["valid_rewards"] == 2.0
    assert np.isnan(m["cos/r1"]) and np.isfinite(m["cos_min"])
    assert bal.alpha_cache.sum() == pytest.approx(1.0)
    losses, counts = reward_losses(toy.step(adv))
    assert [int(c) for c in counts] == [6, 0, 6] and float(losses[1].detach()) == 0.0


def test_solver_failure_falls_back_to_uniform(monkeypatch):
    def broken(gram):
        raise ValueError("boom")

    monkeypatch.setattr(solve_mod, "min_norm_weights", broken)
    toy = Toy(18)
    bal = build_balancer(BalancerConfig(method="mgda"), NAMES)
    _, m = toy.applied_grad(bal, _adv(19))
    assert m["solver_fallbacks"] == 1.0
    np.testing.assert_allclose([m[f"alpha/{n}"] for n in NAMES], [1 / 3] * 3)


def test_state_dict_round_trip(tmp_path):
    toy = Toy(20)
    cfg = BalancerConfig(method="marble", warmup_steps=1, amortize_every=4)
    bal = build_balancer(cfg, NAMES)
    toy.applied_grad(bal, _adv(21), global_step=0)
    path = tmp_path / "balancer.pt"
    torch.save(bal.state_dict(), path)
    state = torch.load(path, weights_only=True)
    fresh = build_balancer(cfg, NAMES)
    fresh.load_state_dict(state)
    np.testing.assert_array_equal(fresh.alpha_cache, bal.alpha_cache)
    assert fresh.last_full == 0
    a, _ = toy.applied_grad(bal, _adv(22), global_step=2)
    b, m = toy.applied_grad(fresh, _adv(22), global_step=2)
    assert torch.equal(a, b) and m["full_solve"] == 0.0
    other = build_balancer(BalancerConfig(method="equal_alpha"), NAMES)
    other.load_state_dict(state)  # docs/algorithm.md §7.5: a cache from another method is discarded
    assert other.alpha_cache is None
    with pytest.raises(ValueError, match="rewards"):
        build_balancer(cfg, ["x", "y", "z"]).load_state_dict(state)


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="fixed_alphas"):
        build_balancer(BalancerConfig(method="equal_alpha", fixed_alphas=[0.5, 0.6, 0.1]),
                       NAMES)
    bal = build_balancer(BalancerConfig(), NAMES)
    with pytest.raises(ValueError, match=r"\[B, 3\]"):
        bal.backward(Toy(0).step(_adv(0, k=2)))


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
    dict(method="mgda", micro_index=1),  # full solve, cosines only
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
    applied = 1 if m_retain["full_solve"] == 0.0 else 0
    # one forward + backward per reward, KL and (when logged) the weighted-sum direction
    assert f_rec == len(NAMES) + 1 + int(with_ws) + applied


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


def test_strategies_share_one_contract_and_old_state_loads():
    for method in balancers_mod.METHODS:
        bal = build_balancer(BalancerConfig(method=method), NAMES)
        assert bal.method == method and isinstance(bal, balancers_mod.Balancer)
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

    from marble import distributed as dist

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
    """Per-reward and KL gradients are averaged over ranks (marble.distributed) before the
    QP: both ranks apply the same direction, the one a single process gets from the mean."""
    import socket

    import torch.multiprocessing as mp

    from marble.balance import min_norm_weights

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
