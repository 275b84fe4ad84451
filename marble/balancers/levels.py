"""Cosine diagnostics at three levels of one optimizer step (issue 36 item 1).

A balancer's micro-step cosines (`cos/*`, solve.cosine_metrics) read one micro-batch; what the
optimizer moves is the sum over the step's micro-steps, and what it applies is Adam's update.
On a diagnostic step (`balancer.diagnostics_every`) the trainer hands the balancer a
`StepLevels`; every micro-step adds its record, its per-reward gradients and its applied
policy direction (no KL: the micro-level cosines leave it out too), and at the optimizer step:

- micro: each micro-step's min cosine and anti-aligned flag, with its index and where its
  weights came from (`WEIGHT_SOURCES`): a solve on this micro-batch, on another micro-batch of
  the same step, on an earlier step, or fixed weights no solve ever set (weighted sum,
  equal alpha, the advantage-level balancers);
- step: cos(sum_m d_m, sum_m g_k,m) per reward: the step's accumulated policy direction
  against each reward's gradient summed over the same micro-steps;
- update: cos(-(theta_after - theta_before), sum_m g_k,m): AdamW's parameter change (descent,
  so its negative is the gradient-like direction) against each reward's step gradient.

The maths is the pure functions below (tests/test_levels.py checks them by hand); the class
only keeps the running sums. Nothing here reads the device until `result` (one host read, on
diagnostic steps only) or touches p.grad or any RNG: the training trajectory is unchanged.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from marble.balancers.common import cosines

__all__ = ["WEIGHT_SOURCES", "weight_source", "anti_aligned_fraction", "sum_into",
           "level_cosines", "StepLevels"]

# Where a micro-step's weights came from, in the order the metrics list them.
WEIGHT_SOURCES = ("fresh", "same_step", "earlier_step", "fixed")


def weight_source(full_solve: bool, solved_at: int | None, global_step: int,
                  has_alpha: bool) -> str:
    """`fresh`: this micro-step solved; `same_step`: its alpha was solved on another
    micro-batch of this optimizer step; `earlier_step`: on an earlier step; `fixed`: no
    solve sets the weights (weighted sum, equal alpha)."""
    if full_solve:
        return "fresh"
    if not has_alpha or solved_at is None:
        return "fixed"
    return "same_step" if solved_at == global_step else "earlier_step"


def anti_aligned_fraction(min_cosines: Sequence[float]) -> tuple[float, int]:
    """(fraction of finite minima < 0, how many were finite); NaN fraction when none."""
    kept = [c for c in min_cosines if math.isfinite(c)]
    if not kept:
        return float("nan"), 0
    return sum(c < 0 for c in kept) / len(kept), len(kept)


def sum_into(total: torch.Tensor | None, vec: torch.Tensor) -> torch.Tensor:
    """total + vec in float64 (a new tensor when total is None): the step-level sums
    of many micro-steps keep their precision."""
    v = vec.detach().to(torch.float64)
    return v.clone() if total is None else total.add_(v)


def level_cosines(direction: torch.Tensor, reward_sums: Sequence[torch.Tensor | None]) -> torch.Tensor:
    """cos(direction, G_k) per reward (float64); NaN for a reward with no gradient (None or 0)
    or a zero direction."""
    zero = torch.zeros_like(direction)
    grads = [zero if g is None else g for g in reward_sums]
    norms = torch.stack([g.norm() for g in grads])
    return cosines(direction, grads, norms > 0)


def _stats(prefix: str, names, cos: torch.Tensor) -> dict:
    """cos_<level>/<reward>, its min and population variance over the finite entries,
    and anti_aligned_<level> (1 when the min is < 0; NaN when no entry is finite)."""
    finite = cos[torch.isfinite(cos)]
    out = {f"cos_{prefix}/{n}": cos[k] for k, n in enumerate(names)}
    if finite.numel():
        low = finite.min()
        out.update({f"cos_{prefix}_min": low, f"cos_{prefix}_var": finite.var(unbiased=False),
                    f"anti_aligned_{prefix}": (low < 0).to(torch.float64)})
    else:
        out.update({f"cos_{prefix}_min": float("nan"), f"cos_{prefix}_var": float("nan"),
                    f"anti_aligned_{prefix}": float("nan")})
    return out


class StepLevels:
    """The running sums of one diagnostic optimizer step (see the module docstring)."""

    def __init__(self, reward_names: Sequence[str], global_step: int):
        self.names = list(reward_names)
        self.global_step = global_step
        self.direction: torch.Tensor | None = None  # sum_m d_m (policy only)
        self.reward_sums: list[torch.Tensor | None] = [None] * len(self.names)
        self.records: list[tuple[int, str, torch.Tensor]] = []  # (micro, source, min cos)

    def add_micro(self, micro_index: int, source: str, direction: torch.Tensor, grads,
                  valid, min_cos) -> None:
        """One micro-step: its applied policy direction, its all-reduced per-reward gradients
        (a reward absent from the micro-batch contributes nothing), its min cosine."""
        if source not in WEIGHT_SOURCES:
            raise ValueError(f"weight source {source!r}: expected one of {WEIGHT_SOURCES}")
        self.direction = sum_into(self.direction, direction)
        keep = torch.as_tensor(valid, device=direction.device)
        for k, g in enumerate(grads):
            # A reward invalid here adds zeros (no host read to skip it).
            self.reward_sums[k] = sum_into(self.reward_sums[k], g * keep[k].to(g.dtype))
        self.records.append((int(micro_index), source, torch.as_tensor(min_cos)))

    def result(self, update: torch.Tensor | None) -> dict:
        """The metrics line's level keys; `update` = -(theta_after - theta_before) flat, or
        None (a skipped step: the update level is NaN)."""
        if self.direction is None:
            return {"diag_micro_steps": 0}
        out = _stats("step", self.names, level_cosines(self.direction, self.reward_sums))
        if update is not None and bool(update.abs().sum() > 0):
            out.update(_stats("update", self.names, level_cosines(update.double(), self.reward_sums)))
        else:
            out.update(_stats("update", self.names, torch.full((len(self.names),), float("nan"),
                                                                dtype=torch.float64)))
        mins = torch.stack([m.reshape(()).double().cpu() for _, _, m in self.records]).tolist()
        fraction, _ = anti_aligned_fraction(mins)
        out["diag_micro_steps"] = len(self.records)
        out["anti_aligned_micro"] = fraction
        for source in WEIGHT_SOURCES:
            picked = [c for (_, s, _), c in zip(self.records, mins) if s == source]
            if picked:
                out[f"anti_aligned_micro_{source}"], _ = anti_aligned_fraction(picked)
                out[f"diag_micro_steps_{source}"] = len(picked)
        out["diag_micro"] = [{"micro": i, "source": s, "cos_min": c}
                             for (i, s, _), c in zip(self.records, mins)]
        return {k: (float(v) if torch.is_tensor(v) else v) for k, v in out.items()}
