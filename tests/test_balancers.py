"""Balancers on a tiny differentiable toy: amortization identity, masks, schedule, state."""

import numpy as np
import pytest
import torch
from balancer_toy import CLIP, NAMES, SCALE, Toy, _adv, _kl_grad, _masked_reward_grads

import marble.balancers.solve as solve_mod
from marble.balancers import build_balancer, reward_losses
from marble.config import BalancerConfig


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
    """Its applied alpha never comes from the QP; the QP runs only for the diagnostics'
    fresh solve (issue 26 item 4: `cos_solve*`), on diagnostic steps."""
    real, calls = solve_mod.min_norm_weights, []
    monkeypatch.setattr(solve_mod, "min_norm_weights", lambda g: calls.append(1) or real(g))
    toy = Toy(13)
    bal = build_balancer(BalancerConfig(method="equal_alpha", diagnostics_every=2), NAMES)
    for gs in range(4):
        before = len(calls)
        _, m = toy.applied_grad(bal, _adv(gs), global_step=gs)
        assert m["full_solve"] == 0.0 and m["alpha/r2"] == pytest.approx(1 / 3)
        assert ("cos_min" in m) == (gs % 2 == 0) == ("cos_solve_min" in m)
        assert len(calls) - before == (1 if gs % 2 == 0 else 0)


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


def test_a_damaged_schedule_state_is_refused_on_load():
    """The saved schedule state (alpha cache, last solve) is checked on load: a NaN cache
    would be applied as alpha until the next solve, a negative last_full skips the schedule."""
    cfg = BalancerConfig(method="marble")
    good = {"method": "marble", "reward_names": NAMES, "alpha_cache": [0.2, 0.3, 0.5],
            "last_full": 4, "last_alpha": [0.1, 0.4, 0.5], "solver_fallbacks": 0}
    build_balancer(cfg, NAMES).load_state_dict(good)
    for change, message in [({"alpha_cache": [0.2, float("nan"), 0.8]}, "finite"),
                            ({"alpha_cache": [0.5, 0.5]}, "3 finite values"),
                            ({"alpha_cache": [0.7, 0.7, -0.4]}, "simplex"),
                            ({"last_alpha": [1.0]}, "last_alpha"),
                            ({"last_full": -1}, "last_full"), ({"last_full": 2.5}, "last_full")]:
        with pytest.raises(ValueError, match=f"balancer state: .*{message}"):
            build_balancer(cfg, NAMES).load_state_dict({**good, **change})
