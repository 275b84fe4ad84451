"""A tiny differentiable toy for the balancer tests: a 1x1 conv as v_theta, fixed v_old,
v_ref and x0, and per-reward gradients written out independently of the balancers."""

import torch

from marble.balancers import MicroStep
from marble.maths.nft import kl_loss, nft_loss_from_terms, nft_terms
from marble.training.metrics import host_floats

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
        # Metrics are device scalars until the trainer's one read per optimizer step.
        metrics = balancer.backward(self.step(adv, avg, **kw))
        metrics = dict(zip(metrics, host_floats(list(metrics.values()))))
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
