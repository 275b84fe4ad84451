"""What a balancer is handed (`MicroStep`), its losses, and flat-gradient helpers.

Losses (docs/algorithm.md §7.1, §7.6): every objective a balancer backpropagates is sum_i w_i l_i(r_i), one
evaluation of the per-sample NFT loss with per-sample coefficients (`marble.maths.nft.
amortized_coefficients`): the weighted sum, the amortized sum_k alpha_k L_k and each L_k.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Optional

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
    # Per reward, whether any sample of the batch has it (known on the host from the
    # rollout's advantages): skips the pass of an absent reward without a device read.
    # None: read from `advantages` (one host sync).
    reward_present: Optional[tuple] = None
    # `balancer.gram_space: output` (marble/balancers/fresh.py): the prediction v_theta with its
    # graph, and the loss head as a function of a prediction, v -> (loss_per_sample, kl), so
    # dL_k/dv costs a backward through the head alone. None: the balancer cannot use them.
    prediction: Optional[torch.Tensor] = None
    loss_head: Optional[Callable[[torch.Tensor], tuple]] = None
    # `balancer.fresh: exact` (marble/balancers/fresh.py): the recorder of the v_theta forward's
    # LoRA-layer inputs (marble.balancers.per_sample.PerSampleGrads); None elsewhere.
    per_sample: Any = None


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


def loss_scale(step: MicroStep) -> torch.Tensor | float:
    """The GradScaler's factor as a device tensor (no host read: `get_scale()` would sync);
    1.0 without a scaler. `scaler.scale` of a one also initialises the scale as training does."""
    if step.grad_scaler is None:
        return 1.0
    return step.grad_scaler.scale(torch.ones((), device=step.params[0].device))


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


def zero_nonfinite(vec: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-finite entries set to 0 in place, and their count as a device tensor (no host
    read: the trainer sums the counts and reads them once, at the optimizer step)."""
    bad = ~torch.isfinite(vec)
    return vec.masked_fill_(bad, 0.0), bad.sum()


def gram64(vectors: list[torch.Tensor]) -> torch.Tensor:
    """<v_k, v_l> for all pairs, float64, as one [K, K] device tensor.

    Why chunks: a float64 copy of K gradient-sized vectors at once would add K x 8 bytes
    per LoRA parameter to the peak; per chunk of _CHUNK entries the K rows are stacked and
    multiplied as one batched product, accumulated on the device (no host reads)."""
    n = vectors[0].numel()
    gram = torch.zeros(len(vectors), len(vectors), dtype=torch.float64, device=vectors[0].device)
    for s in range(0, n, _CHUNK):
        rows = torch.stack([v[s:s + _CHUNK] for v in vectors]).double()
        gram.addmm_(rows, rows.T)
    return gram


def norms_from_gram(gram: torch.Tensor) -> torch.Tensor:
    return gram.diagonal().clamp(min=0.0).sqrt()


def add_into_grads(params: list, vec: torch.Tensor) -> None:
    offset = 0
    for p in params:
        chunk = vec[offset:offset + p.numel()].view_as(p).to(p.dtype)
        offset += p.numel()
        if p.grad is None:
            p.grad = chunk.clone()
        else:
            p.grad.add_(chunk)


def cosines(d: torch.Tensor, grads: list, valid: torch.Tensor) -> torch.Tensor:
    """cos(d, g_k) per k as a float64 device tensor; NaN where g_k is invalid or d = 0."""
    gram = gram64([d, *grads])
    norms = norms_from_gram(gram)
    cos = gram[0, 1:] / (norms[0] * norms[1:])
    keep = valid.to(cos.device) & (norms[0] > 0)
    return torch.where(keep, cos, torch.full_like(cos, float("nan")))
