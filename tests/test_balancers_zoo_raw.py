"""`balancer.zoo_gradients: raw`: a zoo weighting on the raw Gram, as its authors published it."""

import numpy as np
from extras import needs
import torch
from balancer_toy import NAMES, Toy, _adv, _kl_grad, _masked_reward_grads

from marble.balancers import build_balancer
from marble.config import BalancerConfig
from marble.maths.qp import min_norm_weights

needs("torchjd", "zoo", module_level=True)


def _cfg(gradients):
    return BalancerConfig(method="gramian", weighting="mgda", zoo_gradients=gradients,
                          warmup_steps=1, amortize_every=10, alpha_ema=0.0, diagnostics_every=0)


def test_raw_mgda_solves_on_the_raw_gram_without_rescale():
    toy, adv = Toy(30, kl_weight=0.0), _adv(31)
    g = _masked_reward_grads(toy, adv)
    raw_gram = torch.stack(g).double() @ torch.stack(g).double().T
    alpha = min_norm_weights(raw_gram.numpy())  # Sener & Koltun on the raw gradients
    got, m = toy.applied_grad(build_balancer(_cfg("raw"), NAMES), adv, global_step=0)
    assert m["full_solve"] == 1.0
    np.testing.assert_allclose([m[f"alpha/{n}"] for n in NAMES], alpha, atol=1e-4)
    expected = sum(float(a) * gk for a, gk in zip(alpha, g))
    torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-6)
    # the unit form (ours so far) is another direction on these gradients
    unit, _ = toy.applied_grad(build_balancer(_cfg("unit"), NAMES), adv, global_step=0)
    assert (unit - expected).norm() > 1e-2 * expected.norm()


def test_raw_weights_amortize_as_the_solves_own_direction():
    """Raw weights are already in the form the amortized step applies: on unchanged
    gradients (rho = 0) the one backward repeats the solve's direction."""
    toy, adv = Toy(32), _adv(33)
    bal = build_balancer(_cfg("raw"), NAMES)
    solve, _ = toy.applied_grad(bal, adv, global_step=0)
    amortized, m = toy.applied_grad(bal, adv, global_step=1)
    assert m["full_solve"] == 0.0
    torch.testing.assert_close(amortized, solve, rtol=1e-4, atol=1e-6)
    assert _kl_grad(toy, adv).norm() > 0
