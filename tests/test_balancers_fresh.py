"""Issue 37's balancer options on the toy: norm-corrected cached weights and the output Gram."""

import dataclasses

import numpy as np
import pytest
import torch
from balancer_toy import NAMES, Toy, _adv, _kl_grad, _masked_reward_grads

from marble.balancers import build_balancer
from marble.config import BalancerConfig, ConfigError, load_config
from marble.maths.fresh_balance import gram_weights

NORMCORR = dict(method="marble", warmup_steps=1, amortize_every=10, diagnostics_every=0,
                cached_weights="norm_corrected")


def _solve_direction(toy, adv, alpha):
    """n_mean sum_k alpha_k g_k / |g_k| over the rewards with a gradient, + KL (D.4)."""
    g = _masked_reward_grads(toy, adv)
    norms = [float(x.norm()) for x in g]
    idx = [k for k, n in enumerate(norms) if n > 0]
    mean = np.mean([norms[k] for k in idx])
    return sum(float(alpha[k]) * mean / norms[k] * g[k] for k in idx) + _kl_grad(toy, adv), norms


@pytest.mark.parametrize("rho", [0.0, 0.7])
def test_norm_corrected_step_is_the_solves_direction_on_unchanged_gradients(rho):
    """The issue's test: solve at step 0, amortize at step 1 on the same micro-batch (the
    gradients did not change): the one backward applies the solve's own direction."""
    toy, adv = Toy(2), _adv(3)
    bal = build_balancer(BalancerConfig(**{**NORMCORR, "alpha_ema": rho}), NAMES)
    solve, m0 = toy.applied_grad(bal, adv, global_step=0)
    amortized, m1 = toy.applied_grad(bal, adv, global_step=1)
    assert (m0["full_solve"], m1["full_solve"]) == (1.0, 0.0)
    torch.testing.assert_close(amortized, solve, rtol=1e-5, atol=1e-6)
    # the reference's cached alpha on raw gradients is another direction on the same batch
    ref = build_balancer(BalancerConfig(**{**NORMCORR, "cached_weights": "reference"}), NAMES)
    toy.applied_grad(ref, adv, global_step=0)
    raw, _ = toy.applied_grad(ref, adv, global_step=1)
    assert (raw - solve).norm() > 1e-3 * solve.norm()


def test_norm_corrected_with_alpha_ema_and_an_absent_reward():
    """EMA: the cache is rho alpha_1 + (1 - rho) alpha_2 (on the simplex, as the reference);
    norms: the last solve's, except a reward absent from it, which keeps its last norm; the
    mean norm is the last solve's (over its valid rewards)."""
    toy = Toy(4)
    adv_a, adv_b = _adv(5), _adv(6)
    adv_b[:, 2] = float("nan")  # reward r2 is absent from the second solve's micro-batch
    bal = build_balancer(BalancerConfig(**{**NORMCORR, "amortize_every": 1, "alpha_ema": 0.7}),
                         NAMES)
    _, m_a = toy.applied_grad(bal, adv_a, global_step=0)
    _, m_b = toy.applied_grad(bal, adv_b, global_step=1)
    alpha_a = np.array([m_a[f"alpha/{n}"] for n in NAMES])
    alpha_b = np.array([m_b[f"alpha/{n}"] for n in NAMES])
    assert alpha_b[2] == 0.0
    np.testing.assert_allclose(bal.alpha_cache, 0.7 * alpha_a + 0.3 * alpha_b)
    norms_a = [float(x.norm()) for x in _masked_reward_grads(toy, adv_a)]
    norms_b = [float(x.norm()) for x in _masked_reward_grads(toy, adv_b)]
    np.testing.assert_allclose(bal.cached_norms, [norms_b[0], norms_b[1], norms_a[2]], rtol=1e-5)
    assert bal.cached_mean_norm == pytest.approx((norms_b[0] + norms_b[1]) / 2, rel=1e-5)
    # the amortized step on a batch with every reward: w_k = alpha_cache_k n_mean / norm_k
    bal.cfg = dataclasses.replace(bal.cfg, amortize_every=10)
    adv_c = _adv(7)
    got, m = toy.applied_grad(bal, adv_c, global_step=2)
    assert m["full_solve"] == 0.0
    w = bal.alpha_cache * bal.cached_mean_norm / bal.cached_norms
    np.testing.assert_allclose([m[f"weight/{n}"] for n in NAMES], w, rtol=1e-6)
    g = _masked_reward_grads(toy, adv_c)
    expected = sum(float(wk) * gk for wk, gk in zip(w, g)) + _kl_grad(toy, adv_c)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_norm_corrected_reference_fill_is_the_combined_loss_times_the_total():
    """exact_masking false (the reference's combined advantage, simplex only): the weights
    enter as the simplex point w / sum w, the loss times sum w; without masks this is
    sum_k w_k g_k exactly (no advantage clipped here)."""
    toy, adv = Toy(8), _adv(9)
    bal = build_balancer(BalancerConfig(**{**NORMCORR, "exact_masking": False}), NAMES)
    solve, _ = toy.applied_grad(bal, adv, global_step=0)
    amortized, _ = toy.applied_grad(bal, adv, global_step=1)
    torch.testing.assert_close(amortized, solve, rtol=1e-5, atol=1e-6)


def test_norm_corrected_state_round_trips_and_a_reference_cache_resolves(tmp_path):
    toy, adv = Toy(10), _adv(11)
    cfg = BalancerConfig(**NORMCORR)
    bal = build_balancer(cfg, NAMES)
    toy.applied_grad(bal, adv, global_step=0)
    torch.save(bal.state_dict(), tmp_path / "b.pt")
    state = torch.load(tmp_path / "b.pt", weights_only=True)
    again = build_balancer(cfg, NAMES)
    again.load_state_dict(state)
    np.testing.assert_array_equal(again.cached_norms, bal.cached_norms)
    assert again.cached_mean_norm == bal.cached_mean_norm and again.last_full == 0
    a, _ = toy.applied_grad(bal, _adv(12), global_step=3)
    b, m = toy.applied_grad(again, _adv(12), global_step=3)
    assert torch.equal(a, b) and m["full_solve"] == 0.0
    # a cache saved by `cached_weights: reference` has no norms: the next micro-step solves
    plain = build_balancer(BalancerConfig(**{**NORMCORR, "cached_weights": "reference"}), NAMES)
    toy.applied_grad(plain, adv, global_step=0)
    resumed = build_balancer(cfg, NAMES)
    resumed.load_state_dict(plain.state_dict())
    _, m = toy.applied_grad(resumed, adv, global_step=1)
    assert m["full_solve"] == 1.0 and resumed.cached_norms is not None
    with pytest.raises(ValueError, match="cached_norms"):
        build_balancer(cfg, NAMES).load_state_dict({**state, "cached_norms": [1.0, -2.0, 1.0]})


class HeadToy(Toy):
    """The toy with the prediction and the loss head of a prediction (MicroStep fields that
    `marble.training.microstep.build_micro_step` fills)."""

    def step(self, adv, avg=None, global_step=0, micro_index=0):
        from balancer_toy import BETA, CLIP

        from marble.maths.nft import kl_loss, nft_loss_from_terms, nft_terms

        base = super().step(adv, avg, global_step, micro_index)

        def head(v):
            l_pos, l_neg = nft_terms(v, self.v_old, self.x0, self.x_t, self.t, BETA)
            return ((lambda r: nft_loss_from_terms(l_pos, l_neg, r, BETA, CLIP)),
                    self.kl_weight * kl_loss(v, self.v_ref).mean())

        v = self.model(self.x_t)
        lps, kl = head(v)
        return dataclasses.replace(base, loss_per_sample=lps, kl=kl, prediction=v, loss_head=head,
                                   recompute=lambda: self.step(adv, avg, global_step, micro_index))


def _output_grads(toy, adv):
    """dL_k/dv of the masked per-reward losses, written out with their own formula."""
    from balancer_toy import CLIP

    v = toy.model(toy.x_t).detach().requires_grad_(True)
    lps, _ = toy.step(adv).loss_head(v)
    out = []
    for k in range(adv.shape[1]):
        col = adv[:, k]
        valid = ~torch.isnan(col)
        r = torch.nan_to_num(col).clamp(-CLIP, CLIP) / (2 * CLIP) + 0.5
        loss = lps(r)[valid].sum() / max(int(valid.sum()), 1)
        out.append(torch.autograd.grad(loss, v, retain_graph=True)[0].reshape(-1).double())
    return out


@pytest.mark.parametrize("normalise", ["unit", "raw"])
def test_output_gram_applies_the_fresh_output_space_solve_with_one_forward(normalise):
    toy, adv = HeadToy(12), _adv(13)
    adv[0, 1] = adv[4, 2] = float("nan")
    bal = build_balancer(BalancerConfig(method="marble", gram_space="output",
                                        output_gradients=normalise, diagnostics_every=0), NAMES)
    before = toy.forwards
    got, m = toy.applied_grad(bal, adv, global_step=0)
    assert toy.forwards - before == 1 and m["full_solve"] == 0.0  # no per-reward transformer pass
    u = _output_grads(toy, adv)
    gram = torch.stack(u) @ torch.stack(u).T
    w, alpha, _, _, _ = gram_weights(gram.numpy(), 1e-12, normalise)
    np.testing.assert_allclose([m[f"alpha/{n}"] for n in NAMES], alpha, atol=1e-6)
    g = _masked_reward_grads(toy, adv)
    expected = sum(float(wk) * gk for wk, gk in zip(w, g)) + _kl_grad(toy, adv)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)
    # the min-norm point: in output space no reward is opposed (unit: every cos >= |d|)
    assert m["out_cos_min"] >= -1e-9
    # every micro-step is fresh: another micro-batch, other weights, still no solve
    _, m2 = toy.applied_grad(bal, _adv(14), global_step=0, micro_index=1)
    assert m2["full_solve"] == 0.0 and m2["alpha/r0"] != m["alpha/r0"]


def test_output_gram_diagnostics_measure_parameter_space_cosines():
    toy, adv = HeadToy(15), _adv(16)
    bal = build_balancer(BalancerConfig(method="marble", gram_space="output",
                                        diagnostics_every=1), NAMES)
    plain = build_balancer(BalancerConfig(method="marble", gram_space="output",
                                          diagnostics_every=0), NAMES)
    got, m = toy.applied_grad(bal, adv, global_step=0)
    same, _ = toy.applied_grad(plain, adv, global_step=0)
    torch.testing.assert_close(got, same, rtol=1e-5, atol=1e-6)  # diagnostics change no step
    g = _masked_reward_grads(toy, adv)
    applied = got - _kl_grad(toy, adv)
    cos = [float(applied @ gk / (applied.norm() * gk.norm())) for gk in g]
    np.testing.assert_allclose([m[f"cos/{n}"] for n in NAMES], cos, atol=1e-5)
    assert m["anti_aligned"] == float(min(cos) < 0)


def test_output_gram_needs_the_prediction_and_the_pairings_are_checked():
    bal = build_balancer(BalancerConfig(method="marble", gram_space="output"), NAMES)
    with pytest.raises(ConfigError, match="prediction"):
        bal.backward(Toy(0).step(_adv(0)))
    for bad, match in [(["balancer.method=weighted_sum", "balancer.gram_space=output"], "gram_space"),
                       (["balancer.gram_space=output", "balancer.exact_masking=false"], "exact_masking"),
                       (["balancer.method=mgda", "balancer.cached_weights=norm_corrected"],
                        "norm_corrected"),
                       (["balancer.output_gradients=raw"], "output_gradients"),
                       (["balancer.zoo_gradients=raw"], "zoo_gradients"),
                       (["balancer.method=gramian", "balancer.weighting=mgda",
                         "balancer.zoo_gradients=raw", "balancer.cached_weights=norm_corrected"],
                        "need no")]:
        with pytest.raises(ConfigError, match=match):
            load_config("tiny", overrides=bad)
