"""The pieces of a full solve (docs/algorithm.md §7.2) and of the cosine diagnostics (docs/algorithm.md §7.7).

Gradient passes run either on one graph kept alive for all of them (`retain`, the
reference) or each on its own forward (`recompute`): the first pass uses the micro-step's
graph, every later one `MicroStep.recompute()`, and no graph outlives its backward. A full
solve is one micro-step in hundreds, so K extra forwards cost little time and keep the
peak memory at a plain step's.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np
import torch

from marble.balancers.common import (
    MicroStep,
    cosines,
    dot64,
    flat_grad,
    flat_zeros,
    loss_scale,
    scaled,
    with_graph_of,
    zero_nonfinite,
)
from marble.maths.qp import min_norm_weights
from marble.runtime.distributed import all_reduce_mean_

__all__ = ["gradient_passes", "reduce_reward_grads", "combine", "cosine_metrics"]

LossFn = Callable[[MicroStep], torch.Tensor]


def gradient_passes(step: MicroStep, losses: Sequence[Optional[LossFn]],
                    recompute: bool) -> tuple[list[torch.Tensor], list[float]]:
    """Flat local gradient of step.scale * loss(step) and the value of loss(step), per loss;
    a None entry is a zero gradient (no backward, no forward) and a NaN value. Under fp16
    each backward runs on the GradScaler-scaled loss (no underflow) and is divided back:
    the returned gradients are unscaled."""
    live = [i for i, fn in enumerate(losses) if fn is not None]
    if recompute and len(live) > 1 and step.recompute is None:
        raise ValueError("balancer.full_solve = recompute needs MicroStep.recompute: a callable "
                         "that reruns this micro-step's forward")
    grads = [flat_zeros(step.params) if fn is None else None for fn in losses]
    values = [float("nan")] * len(losses)
    for n, i in enumerate(live):
        on = step if (n == 0 or not recompute) else with_graph_of(step, step.recompute())
        loss = losses[i](on)
        grads[i] = flat_grad(scaled(step, step.scale * loss), step.params, retain=not recompute)
        if step.grad_scaler is not None:
            grads[i].div_(loss_scale(step))
        values[i] = float(loss.detach())
        del loss, on
    return grads, values


def reduce_reward_grads(local: list[torch.Tensor], grad_eps: float):
    """All-reduced per-reward gradients (non-finite entries zeroed before and after the
    reduction), their float64 norms, validity (finite, norm > eps) and the zeroed count."""
    grads, nonfinite = [], 0
    for g in local:  # in place: the local vectors are not used afterwards
        g, bad = zero_nonfinite(g)
        g, bad_after = zero_nonfinite(all_reduce_mean_(g))
        grads.append(g)
        nonfinite += bad + bad_after
    norms = np.array([np.sqrt(max(dot64(g, g), 0.0)) for g in grads])
    valid = np.isfinite(norms) & (norms > grad_eps)
    return grads, norms, valid, nonfinite


def combine(grads, norms, valid) -> tuple[torch.Tensor, np.ndarray, bool]:
    """MGDA on unit gradients, rescaled by the mean norm (docs/algorithm.md §7.2).

    Returns (direction, alpha over all K rewards, whether the solver failed and the
    reference's uniform-alpha fallback was used)."""
    alpha = np.zeros(len(grads))
    idx = [k for k in range(len(grads)) if valid[k]]
    if not idx:
        return torch.zeros_like(grads[0]), alpha, False
    if len(idx) == 1:
        alpha[idx[0]] = 1.0
        return grads[idx[0]].clone(), alpha, False
    # Gram of the unit gradients from the raw ones (<g_k, g_l> / (|g_k| |g_l|)) and the
    # direction accumulated in place: no K unit-vector copies of gradient size in memory.
    gram = np.array([[dot64(grads[k], grads[l]) / (norms[k] * norms[l]) for l in idx]
                     for k in idx])
    failed = False
    try:
        a = min_norm_weights(gram)
    except (ValueError, RuntimeError, np.linalg.LinAlgError):
        failed, a = True, np.full(len(idx), 1.0 / len(idx))
    direction = torch.zeros_like(grads[idx[0]])
    mean_norm = float(norms[idx].mean())
    for w, k in zip(a, idx):
        direction.add_(grads[k], alpha=float(w) * mean_norm / float(norms[k]))
    alpha[idx] = a
    return direction, alpha, failed


def cosine_metrics(names, directions: list[tuple[str, torch.Tensor]], grads, norms,
                   valid) -> dict[str, float]:
    """cos(d, g_k) per reward and min/mean/var over the rewards that have a gradient
    (float64; population variance); `anti_aligned*` = 1 when the minimum is < 0."""
    out: dict[str, float] = {}
    for tag, d in directions:
        cos = cosines(d, grads, norms, valid)
        kept = cos[np.isfinite(cos)]
        for name, c in zip(names, cos):
            out[f"{tag}/{name}"] = float(c)
        nan = float("nan")
        out[f"{tag}_min"] = float(kept.min()) if kept.size else nan
        out[f"{tag}_mean"] = float(kept.mean()) if kept.size else nan
        out[f"{tag}_var"] = float(kept.var()) if kept.size else nan
        out["anti_aligned" + tag[3:]] = float(kept.min() < 0) if kept.size else nan
    return out
