"""`balancer.gram_space: output` on the trainer's real micro-step (marble.training.microstep):
the prediction and loss head it hands over, and the applied gradient against one built by hand
from the spec's NFT formulas (test_microstep's helpers)."""

from __future__ import annotations

import pytest
import torch
from test_microstep import TCFG, K, _batch, _per_sample_nft, _v, model  # noqa: F401 (fixture)

from marble.balancers import build_balancer
from marble.config import BalancerConfig
from marble.maths.fresh_balance import gram_weights
from marble.runtime.precision import make_precision
from marble.training.microstep import build_micro_step


def _flat(grads):
    return torch.cat([g.reshape(-1) for g in grads]).double()


def test_output_gram_micro_step_equals_the_hand_built_output_space_solve(model):  # noqa: F811
    tr, params = model
    batch, scale = _batch(tr), 0.25
    bal = build_balancer(BalancerConfig(method="marble", gram_space="output",
                                        diagnostics_every=10**9), [f"r{k}" for k in range(K)])
    for p in params:
        p.grad = None
    step = build_micro_step(tr, batch, TCFG, params, make_precision("no", torch.device("cpu")),
                            scale=scale, global_step=3, micro_index=1)
    v_theta = _v(tr, batch, "default")
    v_old, v_ref = _v(tr, batch, "old"), _v(tr, batch, None)
    assert step.prediction.requires_grad
    torch.testing.assert_close(step.prediction, v_theta.float())
    metrics = bal.backward(step)
    got = _flat([p.grad for p in params])

    # dL_k/dv by hand: the masked mean of the spec's per-sample loss at a leaf copy of v
    v = v_theta.detach().double().requires_grad_(True)
    u = []
    for k in range(K):
        adv = batch.advantages[:, k]
        valid = torch.isfinite(adv)
        loss = _per_sample_nft(v, v_old, batch, torch.nan_to_num(adv))[valid].sum() / valid.sum()
        u.append(torch.autograd.grad(loss, v)[0].reshape(-1))
    gram = torch.stack(u) @ torch.stack(u).T
    w, alpha, _, _, _ = gram_weights(gram.numpy(), 1e-12, "unit")
    assert [metrics[f"alpha/r{k}"] for k in range(K)] == pytest.approx(list(alpha), abs=1e-6)

    policy = 0.0
    for k in range(K):
        adv = batch.advantages[:, k]
        valid = torch.isfinite(adv)
        per = _per_sample_nft(v_theta, v_old, batch, torch.nan_to_num(adv))
        policy = policy + float(w[k]) * per[valid].sum() / valid.sum()
    kl = TCFG.kl_beta * ((v_theta - v_ref) ** 2).mean(dim=(1, 2, 3)).mean()
    want = _flat(torch.autograd.grad(scale * (policy + kl.double()), params, retain_graph=True))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6 * float(want.abs().max()))
    # sharp enough: uniform weights (the equal-alpha step) are far outside the tolerance
    uniform = 0.0
    for k in range(K):
        adv = batch.advantages[:, k]
        valid = torch.isfinite(adv)
        per = _per_sample_nft(v_theta, v_old, batch, torch.nan_to_num(adv))
        uniform = uniform + per[valid].sum() / valid.sum() / K
    other = _flat(torch.autograd.grad(scale * (uniform + kl.double()), params))
    assert (other - got).norm() > 1e-3 * got.norm()

