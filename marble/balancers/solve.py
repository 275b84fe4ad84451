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
    flat_grad,
    flat_zeros,
    gram64,
    loss_scale,
    norms_from_gram,
    scaled,
    with_graph_of,
    zero_nonfinite,
)
from marble.maths.fresh_balance import gram_weights, unit_form_weights
from marble.maths.qp import min_norm_weights
from marble.runtime.distributed import all_reduce_mean_

__all__ = ["gradient_passes", "reduce_reward_grads", "host_gram", "combine", "cosine_metrics",
           "solve_gap_metrics", "alpha_combination"]

LossFn = Callable[[MicroStep], torch.Tensor]


def gradient_passes(step: MicroStep, losses: Sequence[Optional[LossFn]],
                    recompute: bool) -> tuple[list[torch.Tensor], list]:
    """Flat local gradient of step.scale * loss(step) and the value of loss(step) (a
    detached device scalar), per loss; a None entry is a zero gradient (no backward, no
    forward) and a NaN value. Under fp16 each backward runs on the GradScaler-scaled loss
    (no underflow) and is divided back: the returned gradients are unscaled."""
    live = [i for i, fn in enumerate(losses) if fn is not None]
    if recompute and len(live) > 1 and step.recompute is None:
        raise ValueError("balancer.full_solve = recompute needs MicroStep.recompute: a callable "
                         "that reruns this micro-step's forward")
    grads = [flat_zeros(step.params) if fn is None else None for fn in losses]
    values: list = [float("nan")] * len(losses)
    for n, i in enumerate(live):
        on = step if (n == 0 or not recompute) else with_graph_of(step, step.recompute())
        loss = losses[i](on)
        grads[i] = flat_grad(scaled(step, step.scale * loss), step.params, retain=not recompute)
        if step.grad_scaler is not None:
            grads[i].div_(loss_scale(step))
        values[i] = loss.detach()
        del loss, on
    return grads, values


def reduce_reward_grads(local: list[torch.Tensor], grad_eps: float):
    """All-reduced per-reward gradients (non-finite entries zeroed before and after the
    reduction), their float64 Gram matrix, norms and validity (finite, norm > eps) and the
    zeroed count, all on the device."""
    grads, nonfinite = [], 0
    for g in local:  # in place: the local vectors are not used afterwards
        g, bad = zero_nonfinite(g)
        g, bad_after = zero_nonfinite(all_reduce_mean_(g))
        grads.append(g)
        nonfinite = nonfinite + bad + bad_after
    gram = gram64(grads)
    norms = norms_from_gram(gram)
    valid = torch.isfinite(norms) & (norms > grad_eps)
    return grads, gram, norms, valid, nonfinite


def host_gram(gram: torch.Tensor) -> np.ndarray:
    """The one host read of a full solve: the K x K Gram matrix, for the QP.

    Meta tensors (`marble bench flops` counts a step's cost on them) have no values; a
    solve's cost does not depend on them, so they read as K orthonormal gradients."""
    if gram.is_meta:
        return np.eye(gram.shape[0])
    return np.array(gram.tolist(), dtype=np.float64)


def combine(grads, gram: torch.Tensor, grad_eps: float, solver=None):
    """MGDA on unit gradients, rescaled by the mean norm (docs/algorithm.md §7.2).

    `solver(unit_gram, rewards) -> weights` (the indices of the valid rewards the Gramian's
    rows are) replaces the min-norm QP (None): the `gramian` balancer passes a torchjd
    weighting (marble/balancers/gramian.py), on the same unit Gramian. A solver with
    `gradients = "raw"` (the zoo's `balancer.zoo_gradients: raw`, the weightings as
    published) reads the raw Gram and its direction is sum_k w_k g_k, no rescale. The
    weights are `marble.maths.fresh_balance.gram_weights`'s (shared with the output Gram).

    Returns (direction, alpha over all K rewards, whether the solver failed and the
    reference's uniform-alpha fallback was used, the norms and validity on the host)."""
    normalise = "raw" if getattr(solver, "gradients", "unit") == "raw" else "unit"
    qp = solver if solver is not None else (lambda sub, rewards: min_norm_weights(sub))
    w, alpha, valid, norms, failed = gram_weights(host_gram(gram), grad_eps, normalise, qp)
    # accumulated in place: no K unit-vector copies of gradient size in memory
    direction = torch.zeros_like(grads[0])
    for k in np.flatnonzero(valid):
        direction.add_(grads[k], alpha=float(w[k]))
    return direction, alpha, failed, norms, valid


def _nan_stats(cos: torch.Tensor) -> tuple:
    """min, mean, population variance of the finite entries (NaN when there are none),
    and min < 0; device tensors, as numpy's min/mean/var of the kept entries."""
    kept = torch.isfinite(cos)
    n = kept.sum()
    nan = torch.full((), float("nan"), dtype=cos.dtype, device=cos.device)
    zeroed = torch.where(kept, cos, torch.zeros_like(cos))
    mean = zeroed.sum() / n
    var = torch.where(kept, (cos - mean) ** 2, torch.zeros_like(cos)).sum() / n
    low = torch.where(kept, cos, torch.full_like(cos, float("inf"))).min()
    some = n > 0
    return (torch.where(some, low, nan), torch.where(some, mean, nan),
            torch.where(some, var, nan), torch.where(some, (low < 0).to(cos.dtype), nan))


def cosine_metrics(names, directions: list[tuple[str, torch.Tensor]], grads,
                   valid: torch.Tensor) -> dict:
    """cos(d, g_k) per reward and min/mean/var over the rewards that have a gradient
    (float64; population variance); `anti_aligned*` = 1 when the minimum is < 0. Values
    are device scalars (read once per optimizer step by the trainer)."""
    out: dict = {}
    valid = torch.as_tensor(valid, device=grads[0].device)
    for tag, d in directions:
        cos = cosines(d, grads, valid)
        for k, name in enumerate(names):
            out[f"{tag}/{name}"] = cos[k]
        low, mean, var, anti = _nan_stats(cos)
        out[f"{tag}_min"], out[f"{tag}_mean"], out[f"{tag}_var"] = low, mean, var
        out["anti_aligned" + tag[3:]] = anti
    return out


def _angle_deg(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The angle between two flat vectors in degrees (float64 device scalar; NaN for a zero)."""
    gram = gram64([a, b])
    norms = norms_from_gram(gram)
    cos = (gram[0, 1] / (norms[0] * norms[1])).clamp(-1.0, 1.0)
    return torch.rad2deg(torch.arccos(cos))


def alpha_combination(grads, alpha: np.ndarray, norms: np.ndarray, valid: np.ndarray,
                      unit: bool) -> torch.Tensor:
    """sum_k alpha_k g_k (raw gradients: what an amortized step with exact masking applies) or
    |g|_mean sum_k alpha_k g_k / |g_k| (`unit`: the solve's form, docs/algorithm.md §7.2)."""
    a = np.where(valid, np.asarray(alpha, np.float64), 0.0)
    w = unit_form_weights(a, norms, norms[valid].mean()) if unit and valid.any() else a
    out = torch.zeros_like(grads[0])
    for k in np.flatnonzero(w):
        out.add_(grads[k], alpha=float(w[k]))
    return out


def solve_gap_metrics(names, applied: torch.Tensor, grads, gram: torch.Tensor, grad_eps: float,
                      alpha: np.ndarray | None = None, kl_grad: torch.Tensor | None = None,
                      solved: tuple | None = None) -> dict:
    """Why an applied direction can oppose a reward (issue 26 item 4), on one step's gradients.

    - `cos_solve*`: the direction of a fresh full solve on these gradients (`combine`); it is
      never anti-aligned (min-norm point d of the hull: <d, u_k> >= |d|^2 >= 0).
    - `angle_applied_solve`: degrees between the applied policy direction and that solve.
    - with the applied alpha (amortized MARBLE, equal_alpha): `cos_alpha_unit*` is the alpha in
      the solve's unit-gradient form (the gap to the fresh solve is staleness: interval + EMA),
      `cos_alpha_raw*` the alpha on raw gradients (the gap to the unit form is the gradients'
      norms, which the solve divides out and an amortized step does not), and
      `angle_applied_alpha_raw` the gap between that and the applied direction (advantage
      clipping and the r = 1/2 fill of inexact masking; 0 under exact masking).
    - `angle_kl`: the applied update with the KL gradient (outside the QP) against without.
    Device scalars, as `cosine_metrics`'s. `solved`: a full solve's own `combine` result on
    these gradients (no second QP); otherwise the fresh solve costs this step's one host read
    (the Gram for the QP), on diagnostic steps only."""
    fresh, _, _, norms, valid = solved if solved is not None else combine(grads, gram, grad_eps)
    valid_dev = torch.as_tensor(valid, device=grads[0].device)
    dirs = [("cos_solve", fresh)]
    out: dict = {}
    if alpha is not None:
        raw = alpha_combination(grads, alpha, norms, valid, unit=False)
        dirs += [("cos_alpha_unit", alpha_combination(grads, alpha, norms, valid, unit=True)),
                 ("cos_alpha_raw", raw)]
        out["angle_applied_alpha_raw"] = _angle_deg(applied, raw)
    out.update(cosine_metrics(names, dirs, grads, valid_dev))
    out["angle_applied_solve"] = _angle_deg(applied, fresh)
    if kl_grad is not None:
        out["angle_kl"] = _angle_deg(applied + kl_grad, applied)
    return out
