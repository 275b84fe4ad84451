"""Per-prompt group advantages and the NaN-aware reward mean (docs/algorithm.md §3).

NaN means "reward not applicable to this sample": it is excluded from every
statistic and stays NaN in the output, never read as zero.
"""

from __future__ import annotations

from typing import Hashable, Sequence

import numpy as np
import torch

__all__ = ["group_advantages", "nan_weighted_mean", "nan_mean_reward", "combine_advantages",
           "advantage_correlation", "advantage_slope"]


def _as_tensor(x) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x
    return torch.as_tensor(np.asarray(x, dtype=np.float64))


def _group_index(group_ids: Sequence[Hashable], n: int) -> tuple[torch.Tensor, int]:
    if len(group_ids) != n:
        raise ValueError(f"group_ids has {len(group_ids)} entries but rewards has {n} rows")
    index: dict = {}
    ids = [index.setdefault(g.item() if hasattr(g, "item") else g, len(index)) for g in group_ids]
    return torch.tensor(ids, dtype=torch.long), len(index)


def group_advantages(rewards, group_ids: Sequence[Hashable], eps: float = 1e-4) -> torch.Tensor:
    """A = (R - mean of R over the sample's group) / (std of R over all valid entries + eps).

    `rewards` is [N] or [N, K]; each column is treated independently. Group means use only
    the valid (finite) entries of that group; the std is the population std (numpy's
    default, as the reference tracker) of all valid entries of the column: the global std
    of `sample.global_std=True`. Non-finite rewards give NaN advantages. Returns the same
    shape and dtype (float) as `rewards`.
    """
    r = _as_tensor(rewards)
    if r.dim() not in (1, 2):
        raise ValueError(f"rewards must be [N] or [N, K], got shape {tuple(r.shape)}")
    out_dtype = r.dtype if r.is_floating_point() else torch.float32
    cols = r.reshape(r.shape[0], -1).to(torch.float64)  # statistics in float64
    gid, n_groups = _group_index(group_ids, cols.shape[0])
    gid = gid.to(cols.device)
    valid = torch.isfinite(cols)
    vals = torch.where(valid, cols, torch.zeros_like(cols))
    k = cols.shape[1]
    sums = cols.new_zeros(n_groups, k).index_add_(0, gid, vals)
    counts = cols.new_zeros(n_groups, k).index_add_(0, gid, valid.double())
    group_mean = sums / counts.clamp(min=1)
    n_valid = valid.sum(0).double()
    col_mean = vals.sum(0) / n_valid.clamp(min=1)
    sq_dev = torch.where(valid, (cols - col_mean) ** 2, torch.zeros_like(cols))
    col_std = (sq_dev.sum(0) / n_valid.clamp(min=1)).sqrt()
    adv = (cols - group_mean[gid]) / (col_std + eps)
    adv = torch.where(valid, adv, torch.full_like(adv, float("nan")))
    return adv.reshape(r.shape).to(out_dtype)


def nan_weighted_mean(rewards, weights=None) -> torch.Tensor:
    """Per row, sum_k w_k R_k / sum_k w_k over the applicable (finite) rewards only.

    The weighted-sum baseline's scalar reward (docs/algorithm.md §3). NaN when no reward applies.
    `rewards` [N, K], `weights` [K] (default all ones). Returns [N] in rewards' dtype.
    """
    r = _as_tensor(rewards)
    if r.dim() != 2:
        raise ValueError(f"rewards must be [N, K], got shape {tuple(r.shape)}")
    w = torch.ones(r.shape[1], dtype=torch.float64) if weights is None else _as_tensor(weights)
    w = w.to(device=r.device, dtype=torch.float64).reshape(-1)
    if w.numel() != r.shape[1]:
        raise ValueError(f"weights has {w.numel()} entries but rewards has {r.shape[1]} columns")
    r64 = r.to(torch.float64)
    valid = torch.isfinite(r64)
    w_valid = torch.where(valid, w.expand_as(r64), torch.zeros_like(r64))
    num = (w_valid * torch.where(valid, r64, torch.zeros_like(r64))).sum(1)
    den = w_valid.sum(1)
    out = torch.where(den > 0, num / den.clamp(min=1e-300), torch.full_like(num, float("nan")))
    return out.to(r.dtype if r.is_floating_point() else torch.float32)


# The name used in docs/ARCHITECTURE.md.
nan_mean_reward = nan_weighted_mean


def combine_advantages(advantages: torch.Tensor, alpha) -> torch.Tensor:
    """The reference's amortized advantage A~_i = sum_k alpha_k nan_to_num(A_ki, 0)
    (docs/algorithm.md §7.4)."""
    a = torch.as_tensor(alpha, dtype=torch.float64, device=advantages.device).reshape(-1)
    if advantages.dim() != 2 or a.numel() != advantages.shape[1]:
        raise ValueError(
            f"advantages [B, K] and alpha [K] disagree: {tuple(advantages.shape)} vs {a.numel()}"
        )
    # In the advantages' dtype, like the reference (the product is rounded there, then summed).
    return (torch.nan_to_num(advantages, nan=0.0) * a.to(advantages.dtype)).sum(1)


def _centred_finite_pair(combined, own):
    """(combined, own) as float64, kept where both are finite and centred there; None when fewer
    than 2 samples count. The shared start of the correlation and the slope."""
    c = _as_tensor(combined).double().flatten()
    o = _as_tensor(own).double().flatten()
    if c.numel() != o.numel():
        raise ValueError(f"combined [{c.numel()}] and own [{o.numel()}] advantages differ in length")
    keep = torch.isfinite(c) & torch.isfinite(o)
    c, o = c[keep], o[keep]
    if c.numel() < 2:
        return None
    return c - c.mean(), o - o.mean()


def advantage_correlation(combined, own) -> float:
    """Pearson correlation of a one-per-sample advantage (the weighted sum's, [N]) with one
    reward's own group advantage ([N], NaN where the reward does not apply), over the samples
    where both are finite: how much of the reward's per-prompt signal survives in the combined
    advantage (issue 36 item 3, the dilution (b) is about). A balancer that trains on the
    reward's own advantage (MARBLE's per-reward terms) has correlation 1 by construction. NaN
    when fewer than 2 samples count or either side is constant there (no signal to compare)."""
    pair = _centred_finite_pair(combined, own)
    if pair is None:
        return float("nan")
    c, o = pair
    denom = float(torch.sqrt((c * c).sum() * (o * o).sum()))
    # exactly constant (a group of identical rewards has advantage 0 everywhere): no correlation
    return float((c * o).sum()) / denom if denom > 0 else float("nan")


def advantage_slope(combined, own) -> float:
    """Least-squares slope of the one-per-sample advantage (the weighted sum's) on one reward's
    own group advantage, over the samples where both are finite (issue 47 item 1): how much of a
    unit of the reward's own signal reaches the combined advantage. 1: carried whole; between 0
    and 1: attenuated (diluted by the other rewards' terms, not turned against); below 0:
    opposed. The correlation (advantage_correlation) cannot tell the two apart: it falls when
    the other terms add independent noise as much as when they pull the other way. NaN when
    fewer than 2 samples count or the reward's own advantage is constant there."""
    pair = _centred_finite_pair(combined, own)
    if pair is None:
        return float("nan")
    c, o = pair
    var = float((o * o).sum())
    return float((c * o).sum()) / var if var > 0 else float("nan")
