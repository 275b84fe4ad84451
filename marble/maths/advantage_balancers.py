"""Advantage-level multi-reward balancers: one advantage per sample, no gradients at all.

- `gdpo_advantages` (GDPO, arXiv 2601.05242): each reward normalised within its prompt
  group, (R_k - mean_g) / (std_g + eps), the weighted sum over rewards, then that sum
  normalised over the whole batch, (S - mean_B) / (std_B + eps). Both standard deviations
  are the sample (Bessel-corrected) ones and eps = 1e-4, as the authors' TRL code.
- `reward_sum_advantages` (MixGRPO's multi-reward form): the plain sum of the per-reward
  group advantages this project already computes (`group_advantages`).

NaN = reward not applicable: excluded from every mean and std and from the sum (the
authors' code reads it as 0); a row no reward applies to stays NaN, and the trainer's
weighted-sum path masks it. A group with fewer than two valid entries of a reward has no
spread: its advantages are 0 (the authors' (x - x) / (nan + eps) would be NaN).
"""

from __future__ import annotations

from typing import Hashable, Sequence

import torch

from marble.maths.advantages import group_advantages

__all__ = ["gdpo_advantages", "reward_sum_advantages", "nan_sample_std"]


def _weights(w, k: int, device) -> torch.Tensor:
    out = torch.ones(k, dtype=torch.float64, device=device) if w is None else \
        torch.as_tensor(w, dtype=torch.float64, device=device).reshape(-1)
    if out.numel() != k:
        raise ValueError(f"weights has {out.numel()} entries for {k} rewards")
    return out


def _weighted_nansum(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """sum_k w_k a_k over the finite entries of each row; NaN where none is finite."""
    valid = torch.isfinite(a)
    total = torch.where(valid, a * w, torch.zeros_like(a)).sum(1)
    return torch.where(valid.any(1), total, torch.full_like(total, float("nan")))


def nan_sample_std(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and Bessel-corrected std of the finite entries of a 1-D tensor (NaN std with
    fewer than two, NaN mean with none)."""
    valid = torch.isfinite(x)
    n = valid.sum().double()
    zeroed = torch.where(valid, x, torch.zeros_like(x))
    mean = zeroed.sum() / n
    var = torch.where(valid, (x - mean) ** 2, torch.zeros_like(x)).sum() / (n - 1)
    return mean, torch.where(n > 1, var.sqrt(), torch.full_like(var, float("nan")))


def _group_normalised(col: torch.Tensor, gid: torch.Tensor, eps: float) -> torch.Tensor:
    """(x - group mean) / (group sample std + eps) over the finite entries; 0 where the
    group has < 2 of them; NaN where x is not finite."""
    out = torch.full_like(col, float("nan"))
    for g in torch.unique(gid).tolist():
        rows = gid == g
        mean, std = nan_sample_std(col[rows])
        z = (col[rows] - mean) / (std + eps)
        out[rows] = torch.where(torch.isnan(std) & torch.isfinite(col[rows]),
                                torch.zeros_like(z), z)
    return out


def gdpo_advantages(rewards, group_ids: Sequence[Hashable], weights=None,
                    eps: float = 1e-4) -> torch.Tensor:
    """GDPO's advantage [N] from rewards [N, K] (NaN = not applicable), float64."""
    r = torch.as_tensor(rewards).to(torch.float64)
    if r.dim() != 2 or len(group_ids) != r.shape[0]:
        raise ValueError(f"rewards [N, K] and group_ids [N] disagree: {tuple(r.shape)} vs "
                         f"{len(group_ids)}")
    ids = {g: i for i, g in enumerate(dict.fromkeys(
        g.item() if hasattr(g, "item") else g for g in group_ids))}
    gid = torch.tensor([ids[g.item() if hasattr(g, "item") else g] for g in group_ids])
    per_reward = torch.stack([_group_normalised(r[:, k], gid, eps)
                              for k in range(r.shape[1])], dim=1)
    summed = _weighted_nansum(per_reward, _weights(weights, r.shape[1], r.device))
    mean, std = nan_sample_std(summed)
    return (summed - mean) / (torch.nan_to_num(std, nan=0.0) + eps)


def reward_sum_advantages(rewards, group_ids: Sequence[Hashable], weights=None) -> torch.Tensor:
    """MixGRPO's sum_k w_k A_k [N] of the per-reward group advantages, float64."""
    adv = group_advantages(torch.as_tensor(rewards).to(torch.float64), group_ids)
    return _weighted_nansum(adv, _weights(weights, adv.shape[1], adv.device))
