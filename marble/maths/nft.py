"""The DiffusionNFT loss (docs/algorithm.md §3, §4): implicit positive/negative policies in x0
space.

Shapes: v_theta, v_old, v_ref, x0, x_t are [B, C, H, W] (any trailing dims); t, r are [B].
All functions return per-sample values [B]; the caller averages and scales.
"""

from __future__ import annotations

import torch

from marble.maths.advantages import combine_advantages

__all__ = ["optimality_prob", "nft_terms", "nft_loss_from_terms", "kl_loss",
           "amortized_coefficients", "weighted_loss"]

WEIGHT_FLOOR = 1e-5  # clamp of the adaptive weight (reference train_nft_sd3.py:940-957)


def optimality_prob(adv: torch.Tensor, adv_clip: float = 5.0) -> torch.Tensor:
    """r = clip(A, -C, C) / (2C) + 1/2, in [0, 1]; NaN stays NaN (the caller masks it)."""
    c = float(adv_clip)
    if c <= 0:
        raise ValueError(f"adv_clip must be > 0, got {adv_clip}")
    return (adv.clamp(-c, c) / (2 * c) + 0.5).clamp(0.0, 1.0)


def _per_sample(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    t = torch.as_tensor(t, device=like.device)
    if t.dim() == 0:
        t = t.expand(like.shape[0])
    if t.shape != (like.shape[0],):
        raise ValueError(f"expected a [B] = [{like.shape[0]}] tensor, got {tuple(t.shape)}")
    return t.reshape(-1, *([1] * (like.dim() - 1)))


def _pixel_mean(x: torch.Tensor) -> torch.Tensor:
    return x.mean(dim=tuple(range(1, x.dim())))


def nft_terms(v_theta, v_old, x0, x_t, t, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(l_pos, l_neg), each [B]: the adaptive-weighted x0-space errors of v+ and v-.

    v+ = beta v_theta + (1 - beta) v_old,  v- = (1 + beta) v_old - beta v_theta,
    x0^± = x_t - t v^±,  w^± = max(mean|x0^± - x0|, 1e-5) (float64, no gradient),
    l^± = mean (x0^± - x0)^2 / w^±.
    """
    if not v_theta.shape == v_old.shape == x0.shape == x_t.shape:
        raise ValueError(
            f"shape mismatch: v_theta {tuple(v_theta.shape)}, v_old {tuple(v_old.shape)}, "
            f"x0 {tuple(x0.shape)}, x_t {tuple(x_t.shape)}"
        )
    tb = _per_sample(t, x_t).to(x_t.dtype)
    v_old = v_old.detach()
    v_pos = beta * v_theta + (1.0 - beta) * v_old
    v_neg = (1.0 + beta) * v_old - beta * v_theta
    # Errors in at least float32 so fp16 activations do not overflow when squared.
    work = torch.promote_types(v_theta.dtype, torch.float32)
    err_pos = (x_t - tb * v_pos).to(work) - x0.to(work)
    err_neg = (x_t - tb * v_neg).to(work) - x0.to(work)
    with torch.no_grad():
        w_pos = _pixel_mean(err_pos.double().abs()).clamp(min=WEIGHT_FLOOR)
        w_neg = _pixel_mean(err_neg.double().abs()).clamp(min=WEIGHT_FLOOR)
    # mean(e^2 / w) == mean(e^2) / w because w is per sample; the division is in float64.
    l_pos = (_pixel_mean(err_pos**2).double() / w_pos).to(work)
    l_neg = (_pixel_mean(err_neg**2).double() / w_neg).to(work)
    return l_pos, l_neg


def nft_loss_from_terms(l_pos, l_neg, r, beta: float, adv_clip: float = 5.0) -> torch.Tensor:
    """(C / beta) (r l_pos + (1 - r) l_neg), per sample: affine in r (docs/algorithm.md §4)."""
    r = torch.as_tensor(r, device=l_pos.device).to(l_pos.dtype)
    if r.shape != l_pos.shape:
        raise ValueError(f"r has shape {tuple(r.shape)}, expected {tuple(l_pos.shape)}")
    return (float(adv_clip) / float(beta)) * (r * l_pos + (1.0 - r) * l_neg)


def kl_loss(v_theta: torch.Tensor, v_ref: torch.Tensor) -> torch.Tensor:
    """Per-sample pixel mean of (v_theta - v_ref)^2 [B]; the trainer multiplies by lambda_KL."""
    if v_theta.shape != v_ref.shape:
        raise ValueError(f"v_theta {tuple(v_theta.shape)} and v_ref {tuple(v_ref.shape)} differ")
    work = torch.promote_types(v_theta.dtype, torch.float32)
    return _pixel_mean((v_theta.to(work) - v_ref.detach().to(work)) ** 2)


def amortized_coefficients(advantages: torch.Tensor, alpha, adv_clip: float = 5.0,
                           exact_masking: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(r [B], w [B]) such that sum_i w_i l_i(r_i) = sum_k alpha_k L_k for per-sample losses
    l_i affine in r (the NFT loss is), so the K-reward objective costs one loss evaluation.

    advantages [B, K] (NaN = reward k does not apply to sample i), alpha [K].
    exact_masking=True: L_k is the masked mean over V_k = {i: A_ki finite} of l_i(r(A_ki)), so
      c_ik = alpha_k [i in V_k] / max(|V_k|, 1), w_i = sum_k c_ik, r_i = sum_k c_ik r_ki / w_i
      (affinity: sum_k c_ik l_i(r_ki) = w_i l_i(r_i)); a row no reward applies to gets w_i = 0.
    exact_masking=False (the reference, docs/algorithm.md §7.6): r_i = r(sum_k alpha_k nan->0(A_ki)), the clip
      applied after combining, and w_i = 1/B (plain mean over all samples).
    The weighted-sum baseline is the exact form with K = 1: its mean-reward advantage, alpha = [1].
    """
    if advantages.dim() != 2:
        raise ValueError(f"advantages must be [B, K], got {tuple(advantages.shape)}")
    b, k = advantages.shape
    a = torch.as_tensor(alpha, dtype=torch.float64, device=advantages.device).reshape(-1)
    if a.numel() != k:
        raise ValueError(f"alpha has {a.numel()} values for {k} rewards")
    if not exact_masking:
        # Same arithmetic as the reference: combine in the advantages' dtype, then clip + map.
        r = optimality_prob(combine_advantages(advantages, a), adv_clip)
        return r, torch.full_like(r, 1.0 / max(b, 1))
    valid = torch.isfinite(advantages)
    r_k = optimality_prob(torch.nan_to_num(advantages, nan=0.0), adv_clip).double()
    counts = valid.sum(0).clamp(min=1).double()  # a tensor: no host sync on a GPU
    coef = valid.double() * (a / counts)  # [B, K]
    w = coef.sum(1)
    r = torch.where(w > 0, (coef * r_k).sum(1) / w.clamp(min=1e-300), 0.5)
    return r.to(advantages.dtype), w.to(advantages.dtype)


def weighted_loss(per_sample: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """sum_i w_i l_i, rows with w_i = 0 left out even where l_i is not finite."""
    w = w.to(per_sample.dtype)
    return torch.where(w > 0, per_sample * w, torch.zeros_like(per_sample)).sum()
