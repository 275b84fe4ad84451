"""Issue 46: the exact fresh balance (`balancer.fresh: exact`) against full MGDA on the same
micro-batch: the same weights and update, from two per-sample backward passes."""

from __future__ import annotations


import numpy as np
import pytest
import torch
from balancer_toy import BETA, CLIP, SCALE, _adv

from marble.balancers import MicroStep, build_balancer
from marble.balancers.per_sample import PerSampleGrads
from marble.config import BalancerConfig, ConfigError, load_config
from marble.maths.fresh_balance import affine_coefficients
from marble.maths.nft import kl_loss, nft_loss_from_terms, nft_terms
from marble.training.metrics import host_floats

NAMES = ["r0", "r1", "r2"]
EXACT = dict(method="marble", fresh="exact", alpha_ema=0.0, diagnostics_every=0)


class LinearToy:
    """v_theta = a two-layer MLP over the channels of [B, T, C] (tokens per sample, as a
    transformer's Linear layers see them); v_old, v_ref, x0 fixed."""

    def __init__(self, seed=0, batch=6, tokens=5, width=4):
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(width, 8), torch.nn.Tanh(),
                                         torch.nn.Linear(8, width, bias=False))
        shape = (batch, tokens, width)
        self.x0, noise, self.v_old, self.v_ref = (torch.randn(shape, generator=gen) for _ in range(4))
        self.t = torch.rand(batch, generator=gen) * 0.7 + 0.2
        tb = self.t.view(-1, 1, 1)
        self.x_t = (1 - tb) * self.x0 + tb * noise
        self.params = list(self.model.parameters())

    def step(self, adv, per_sample=True, global_step=0, micro_index=0):
        rec = PerSampleGrads(self.model, self.params) if per_sample else None
        with rec.recording(adv.shape[0]) if rec else torch.enable_grad():
            v = self.model(self.x_t)
        l_pos, l_neg = nft_terms(v, self.v_old, self.x0, self.x_t, self.t, BETA)
        return MicroStep(
            loss_per_sample=lambda r: nft_loss_from_terms(l_pos, l_neg, r, BETA, CLIP),
            kl=1e-2 * kl_loss(v, self.v_ref).mean(), advantages=adv,
            avg_advantage=torch.nanmean(adv, 1), scale=SCALE, params=self.params,
            global_step=global_step, micro_index=micro_index, adv_clip=CLIP, per_sample=rec)

    def applied(self, bal, adv, **kw):
        for p in self.params:
            p.grad = None
        m = bal.backward(self.step(adv, **kw))
        return torch.cat([p.grad.reshape(-1) for p in self.params]), \
            dict(zip(m, host_floats(list(m.values()))))


def _alphas(m):
    return np.array([m[f"alpha/{n}"] for n in NAMES])


@pytest.mark.parametrize("masked", [False, True])
def test_exact_fresh_equals_full_mgda_on_the_same_micro_batch(masked):
    toy, adv = LinearToy(1), _adv(2)
    if masked:
        adv[[0, 2], 1] = adv[[1, 3, 4], 2] = float("nan")
    mgda = build_balancer(BalancerConfig(method="mgda", diagnostics_every=0), NAMES)
    exact = build_balancer(BalancerConfig(**EXACT), NAMES)
    want, m_want = toy.applied(mgda, adv)
    got, m_got = toy.applied(exact, adv)
    np.testing.assert_allclose(_alphas(m_got), _alphas(m_want), atol=1e-6)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    assert m_got["full_solve"] == 1.0 and len(set(_alphas(m_got).round(3))) > 1  # not uniform


def test_exact_fresh_never_opposes_a_reward_without_the_ema_and_measures_it_with():
    """alpha_ema = 0: every micro-step's worst cosine >= -1e-6 (the min-norm theorem on the
    micro-batch's own gradients); alpha_ema = 0.7: the EMA'd cache, in unit form."""
    toy = LinearToy(3)
    exact = build_balancer(BalancerConfig(**{**EXACT, "diagnostics_every": 1}), NAMES)
    smooth = build_balancer(BalancerConfig(**{**EXACT, "diagnostics_every": 1, "alpha_ema": 0.7}),
                            NAMES)
    for micro in range(4):
        adv = _adv(10 + micro)
        _, m = toy.applied(exact, adv, micro_index=micro)
        assert m["cos_min"] >= -1e-6 and m["anti_aligned"] == 0.0
        _, ms = toy.applied(smooth, adv, micro_index=micro)
    cache = smooth.alpha_cache
    assert abs(cache.sum() - 1) < 1e-9 and not np.allclose(cache, _alphas(ms))


def test_affine_coefficients_by_hand():
    """Two samples, two rewards; reward 1 on sample 0 only. r = clip(A, -5, 5) / 10 + 1/2."""
    adv = torch.tensor([[5.0, -5.0], [0.0, float("nan")]])
    a, b = affine_coefficients(adv, 5.0)
    torch.testing.assert_close(a, torch.tensor([[0.5, 0.25], [0.0, 0.0]], dtype=torch.float64))
    torch.testing.assert_close(b, torch.tensor([[0.0, 0.25], [1.0, 0.0]], dtype=torch.float64))


def test_exact_fresh_refusals():
    bal = build_balancer(BalancerConfig(**EXACT), NAMES)
    with pytest.raises(ConfigError, match="per_sample"):
        bal.backward(LinearToy(0).step(_adv(0), per_sample=False))
    conv = torch.nn.Conv2d(2, 2, 1)
    with pytest.raises(ValueError, match="nn.Linear"):
        PerSampleGrads(conv, list(conv.parameters()))
    for bad in (["balancer.method=mgda"], ["balancer.gram_space=output"],
                ["balancer.full_solve=recompute"]):
        with pytest.raises(ConfigError, match="fresh: exact"):
            load_config("tiny", overrides=["balancer.fresh=exact", *bad])


def _slice(toy, rows):
    for name in ("x0", "v_old", "v_ref", "t", "x_t"):
        setattr(toy, name, getattr(toy, name)[rows])
    return toy


def _union_adv():
    adv = _adv(21)
    adv[[1, 2, 4, 5], 2] = float("nan")  # reward 2: one sample on each rank's half
    return adv


def _rank_worker(rank: int, port: int, out_dir: str) -> None:
    import os

    from marble.runtime import distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
                      RANK=str(rank), LOCAL_RANK=str(rank))
    dist.init_distributed("cpu")
    rows = slice(3 * rank, 3 * rank + 3)
    toy = _slice(LinearToy(5), rows)
    bal = build_balancer(BalancerConfig(**EXACT), NAMES)
    got, m = toy.applied(bal, _union_adv()[rows])
    # a full solve adds the all-reduced direction + KL into .grad: the same on every rank (the
    # trainer's later all-reduce of .grad, precision.all_reduce_grads_, leaves it unchanged)
    torch.save({"grad": got, "alpha": _alphas(m)}, os.path.join(out_dir, f"r{rank}.pt"))
    dist.barrier()
    dist.cleanup()


def test_two_gloo_ranks_equal_one_rank_on_the_union_batch(tmp_path):
    """Exact across ranks: the K reward gradients are all-reduced before the Gram (as full
    MGDA's), so 2 ranks of 3 samples solve and step as 1 rank of the 6 (equal counts per
    rank: the masked means average to the union's)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank_worker, args=(port, str(tmp_path)), nprocs=2, join=True)
    one, m = LinearToy(5).applied(build_balancer(BalancerConfig(**EXACT), NAMES), _union_adv())
    for rank in range(2):
        r = torch.load(tmp_path / f"r{rank}.pt", weights_only=False)
        np.testing.assert_allclose(r["alpha"], _alphas(m), atol=1e-6)
        torch.testing.assert_close(r["grad"], one, rtol=1e-5, atol=1e-7)


def test_flow_grpo_clipped_surrogate_is_covered_with_two_basis_functions():
    """Flow-GRPO's per-sample loss -min(rho A, clip(rho, 1 - eps, 1 + eps) A) is piecewise
    affine in A with the pieces fixed by A's sign: l_i(A) = max(A, 0) h+_i + min(A, 0) h-_i,
    h+ = -min(rho, clip rho), h- = -max(rho, clip rho). Two per-sample backward passes give
    every reward's gradient, and the min-norm weights equal those of K per-reward passes."""
    from marble.balancers.solve import combine
    from marble.balancers.common import gram64

    torch.manual_seed(7)
    b, k, eps = 8, 3, 0.2
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))
    params = list(model.parameters())
    x = torch.randn(b, 5, 4)
    adv = torch.randn(b, k) * 1.5
    rec = PerSampleGrads(model, params)
    with rec.recording(b):
        logp = model(x).squeeze(-1).mean(1)  # [B]: a per-sample log-likelihood
    ratio = torch.exp(logp - (logp.detach() + 0.3 * torch.randn(b)))  # some clipped, some not
    clipped = ratio.clamp(1 - eps, 1 + eps)
    assert ((ratio - clipped).abs() > 0).any() and ((ratio - clipped).abs() == 0).any()
    h_pos, h_neg = -torch.minimum(ratio, clipped), -torch.maximum(ratio, clipped)

    def per_reward_loss(j):
        a = adv[:, j]
        return (-torch.minimum(ratio * a, clipped * a)).mean()

    want = [torch.cat([g.reshape(-1) for g in torch.autograd.grad(per_reward_loss(j), params,
                                                                  retain_graph=True)])
            for j in range(k)]
    got = None
    for h, coef in ((h_pos, adv.clamp(min=0).T / b), (h_neg, adv.clamp(max=0).T / b)):
        with rec.contracting(coef) as buf:
            torch.autograd.grad(h.sum(), params, retain_graph=True)
        got = buf if got is None else got + buf
    for j in range(k):
        torch.testing.assert_close(got[j], want[j], rtol=1e-5, atol=1e-7)
    _, a_got, *_ = combine(list(got.unbind()), gram64(list(got.unbind())), 1e-12)
    _, a_want, *_ = combine(want, gram64(want), 1e-12)
    np.testing.assert_allclose(a_got, a_want, atol=1e-6)
