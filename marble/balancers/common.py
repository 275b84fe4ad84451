"""What a balancer is handed (`MicroStep`), its losses, and flat-gradient helpers.

Losses (docs/algorithm.md §7.1, §7.6): every objective a balancer backpropagates is sum_i w_i l_i(r_i), one
evaluation of the per-sample NFT loss with per-sample coefficients (`marble.maths.nft.
amortized_coefficients`): the weighted sum, the amortized sum_k alpha_k L_k and each L_k.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import torch

from marble.maths.nft import amortized_coefficients, weighted_loss

__all__ = ["MicroStep", "reward_losses", "reward_loss", "weighted_sum_loss", "amortized_loss"]

_CHUNK = 1 << 20  # float64 dot products in chunks: no full float64 copy of a gradient


@dataclass
class MicroStep:
    loss_per_sample: Callable[[torch.Tensor], torch.Tensor]  # r [B] -> NFT policy loss [B]
    kl: torch.Tensor  # scalar, already multiplied by lambda_KL
    advantages: torch.Tensor  # [B, K], NaN = reward not applicable
    avg_advantage: torch.Tensor  # [B], advantage of the NaN-aware mean reward
    scale: float  # 1 / (G * T_train)
    params: list  # trainable LoRA parameters only
    global_step: int
    micro_index: int  # 0 for the first micro-step of an optimizer step
    adv_clip: float = 5.0
    # fp16: the run's torch.amp.GradScaler. Every backward goes through scaler.scale(...),
    # so .grad holds scaled gradients for unscale_; per-reward gradients of full solves
    # are unscaled before the QP and the result scaled back (reference train.py).
    grad_scaler: Any = None
    # `balancer.full_solve: recompute`: a fresh forward of v_theta on this same micro-batch
    # (same x_t, sigma, embeddings; v_old and v_ref may be reused), returned as a MicroStep
    # whose `loss_per_sample` and `kl` carry a new graph (its other fields are not read).
    recompute: Optional[Callable[[], "MicroStep"]] = None


# ------------------------------------------------------------------ losses


def _loss(step: MicroStep, adv: torch.Tensor, alpha, exact: bool) -> torch.Tensor:
    r, w = amortized_coefficients(adv, alpha, step.adv_clip, exact)
    return weighted_loss(step.loss_per_sample(r), w)


def reward_loss(step: MicroStep, k: int) -> torch.Tensor:
    """L_k = sum over valid i of loss_i(r_ki) / max(|V_k|, 1) (docs/algorithm.md §7.1)."""
    return _loss(step, step.advantages[:, k:k + 1], [1.0], True)


def reward_losses(step: MicroStep) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every L_k and its valid count |V_k|."""
    counts = torch.isfinite(step.advantages).sum(0)
    return ([reward_loss(step, k) for k in range(step.advantages.shape[1])],
            list(counts.unbind()))


def weighted_sum_loss(step: MicroStep) -> torch.Tensor:
    """Baseline loss: the mean-reward advantage, rows with no applicable reward excluded."""
    return _loss(step, step.avg_advantage.reshape(-1, 1), [1.0], True)


def amortized_loss(step: MicroStep, alpha, exact_masking: bool) -> torch.Tensor:
    """sum_k alpha_k L_k (exact masks) or the reference's combined-advantage loss, one
    evaluation of the loss head either way."""
    return _loss(step, step.advantages, alpha, exact_masking)


def with_graph_of(step: MicroStep, fresh: MicroStep) -> MicroStep:
    """`step` with the loss callable and KL of a recomputed forward."""
    return dataclasses.replace(step, loss_per_sample=fresh.loss_per_sample, kl=fresh.kl,
                               recompute=None)


# ------------------------------------------------------------------ vector helpers


def scaled(step: MicroStep, loss: torch.Tensor) -> torch.Tensor:
    """`loss` times the GradScaler's factor (the scaler's own `scale`, which also
    initialises it); unchanged without a scaler."""
    return loss if step.grad_scaler is None else step.grad_scaler.scale(loss)


def loss_scale(step: MicroStep) -> float:
    return 1.0 if step.grad_scaler is None else float(step.grad_scaler.get_scale())


def flat_zeros(params: list) -> torch.Tensor:
    return torch.cat([torch.zeros(p.numel(), device=p.device) for p in params])


def flat_grad(loss: torch.Tensor, params: list, retain: bool = True) -> torch.Tensor:
    """Gradient of `loss` w.r.t. params as one float32 vector."""
    if not loss.requires_grad:
        return flat_zeros(params)
    grads = torch.autograd.grad(loss, params, retain_graph=retain, allow_unused=True)
    return torch.cat([
        (g if g is not None else torch.zeros_like(p)).reshape(-1).float()
        for g, p in zip(grads, params)
    ])


def zero_nonfinite(vec: torch.Tensor) -> tuple[torch.Tensor, int]:
    bad = ~torch.isfinite(vec)
    n_bad = int(bad.sum())
    return (vec.masked_fill(bad, 0.0) if n_bad else vec), n_bad


def dot64(a: torch.Tensor, b: torch.Tensor) -> float:
    total = 0.0
    for s in range(0, a.numel(), _CHUNK):
        total += float(torch.dot(a[s:s + _CHUNK].double(), b[s:s + _CHUNK].double()))
    return total


def add_into_grads(params: list, vec: torch.Tensor) -> None:
    offset = 0
    for p in params:
        chunk = vec[offset:offset + p.numel()].view_as(p).to(p.dtype)
        offset += p.numel()
        if p.grad is None:
            p.grad = chunk.clone()
        else:
            p.grad.add_(chunk)


def cosines(d: torch.Tensor, grads: list, norms: np.ndarray, valid: np.ndarray) -> np.ndarray:
    d_norm = np.sqrt(max(dot64(d, d), 0.0))
    out = np.full(len(grads), np.nan)
    for k, g in enumerate(grads):
        if valid[k] and d_norm > 0:
            out[k] = dot64(d, g) / (d_norm * norms[k])
    return out
