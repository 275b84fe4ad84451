"""Balancing at one backward's cost (issue 37): the pure maths of two named options.

Norm-corrected cached weights (`balancer.cached_weights: norm_corrected`, spec D.6 (c)).
A full solve applies d = n_mean sum_k alpha_k g_k / |g_k| (marble.balancers.solve.combine:
the unit-gradient min-norm point rescaled by the mean norm of the valid rewards). The
reference's amortized step applies sum_k alpha_k g_k instead: raw gradients, so a reward
with a large gradient norm dominates it. Caching w_k = alpha_k n_mean / |g_k| makes the
amortized single backward sum_k w_k L_k follow the solve's direction: exactly the solve's
on unchanged gradients.

Output-space Gram (`balancer.gram_space: output`): MGDA-UB (Sener & Koltun 2018, §3.3) with
the transformer's prediction v as the shared representation. u_k = dL_k/dv costs a backward
through the loss head only; the min-norm QP on the K x K Gram of the u_k gives weights that
are fresh for the micro-batch they are applied to. `unit`: QP on the unit u_k and the
solve's rescale (as `combine` in parameter space); `raw`: QP on the raw u_k, w = alpha.

Exact fresh balance (`balancer.fresh: exact`, issue 46). A per-sample loss affine in its
optimality probability, l_i(r) = r l+_i + (1 - r) l-_i (the NFT loss, with l+-_i = l_i(1),
l_i(0)), makes every masked reward loss L_k = sum_i c_ki l_i(r_ki) an exact combination
sum_i a_ki l+_i + b_ki l-_i of 2B per-sample functions with known coefficients
(`affine_coefficients`): the K reward gradients follow from the per-sample gradients of
l+ and l- (two backward passes, whatever K is).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from marble.maths.nft import amortized_coefficients
from marble.maths.qp import min_norm_weights

__all__ = ["unit_form_weights", "record_solve_norms", "split_total",
           "gram_weights", "output_cosines", "affine_coefficients"]


def unit_form_weights(alpha, norms, mean_norm: float) -> np.ndarray:
    """w_k = alpha_k mean_norm / norms_k: weights on unit gradients in raw-gradient form
    (sum_k w_k g_k = mean_norm sum_k alpha_k g_k / |g_k|, the solve's rescaled direction,
    docs/algorithm.md §7.2). The one home of this rescale: the solve (`gram_weights`), the
    diagnostics' alpha directions, the norm-corrected cache. A reward with alpha_k = 0 or no
    known norm (NaN or 0: never valid at a solve, or a zero gradient) gets w_k = 0."""
    a = np.asarray(alpha, np.float64)
    n = np.asarray(norms, np.float64)
    if a.shape != n.shape:
        raise ValueError(f"alpha {a.shape} and norms {n.shape} differ in length")
    known = np.isfinite(n) & (n > 0) & (a != 0)
    w = np.zeros_like(a)
    w[known] = a[known] * float(mean_norm) / n[known]
    return w


def record_solve_norms(cached, norms, valid) -> tuple[np.ndarray, float | None]:
    """The norms a norm-corrected cache holds after a solve, and the solve's mean norm.

    Per reward, the norm of its latest valid gradient: a reward absent from the solve's
    micro-batch keeps the norm of the last solve it was present at (its EMA'd alpha still
    carries weight from there); NaN = never measured. The mean norm is the solve's own
    (mean over the rewards valid at it, as `combine` rescales); None if none was valid."""
    norms = np.asarray(norms, np.float64)
    valid = np.asarray(valid, bool)
    out = np.full(norms.shape, np.nan) if cached is None else np.array(cached, np.float64)
    out[valid] = norms[valid]
    mean = float(norms[valid].mean()) if valid.any() else None
    return out, mean


def split_total(w) -> tuple[np.ndarray, float]:
    """(w / sum w, sum w) for non-negative weights: a point of the simplex the combined-
    advantage loss takes (the reference's mode is only sum_k a_k L_k on the simplex) and the
    factor the loss is multiplied by. All zero: (zeros, 0)."""
    w = np.asarray(w, np.float64)
    if np.any(w < 0):
        raise ValueError(f"split_total needs weights >= 0, got {w}")
    total = float(w.sum())
    return (w / total if total > 0 else np.zeros_like(w)), total


def gram_weights(gram, grad_eps: float, normalise: str = "unit", solver: Callable | None = None):
    """The weights of a solve from the K x K Gram of K gradients (parameter space:
    `marble.balancers.solve.combine`; output space: `balancer.gram_space: output`).

    Returns (w, alpha, valid, norms, failed): alpha over the valid rewards (finite norm >
    grad_eps; 0 elsewhere), w the weights of the raw gradients the direction sum_k w_k g_k
    applies. `unit`: alpha = solver(<g_k/|g_k|, g_l/|g_l|>), w in unit form with the valid
    rewards' mean norm (`unit_form_weights`); `raw`: alpha = solver(<g_k, g_l>), w = alpha.
    One valid reward: alpha = w = 1 (its raw gradient). `solver(sub_gram, rewards)` (the
    indices of the valid rewards): the min-norm QP if None. A solver that fails (ValueError,
    RuntimeError, LinAlgError) gives the reference's uniform alpha and failed = True."""
    if normalise not in ("unit", "raw"):
        raise ValueError(f"normalise must be 'unit' or 'raw', got {normalise!r}")
    g = np.asarray(gram, np.float64)
    norms = np.sqrt(np.maximum(np.diag(g), 0.0))
    valid = np.isfinite(norms) & (norms > grad_eps)
    alpha = np.zeros(len(g))
    idx = np.flatnonzero(valid)
    if len(idx) <= 1:
        alpha[idx] = 1.0
        return alpha.copy(), alpha, valid, norms, False
    sub = g[np.ix_(idx, idx)]
    if normalise == "unit":
        sub = sub / np.outer(norms[idx], norms[idx])
    failed = False
    try:
        alpha[idx] = min_norm_weights(sub) if solver is None else solver(sub, tuple(map(int, idx)))
    except (ValueError, RuntimeError, np.linalg.LinAlgError):
        failed, alpha[idx] = True, 1.0 / len(idx)
    w = unit_form_weights(alpha, norms, norms[idx].mean()) if normalise == "unit" else alpha.copy()
    return w, alpha, valid, norms, failed


def output_cosines(gram, w) -> np.ndarray:
    """cos(d, u_k) for d = sum_l w_l u_l from the Gram alone: (G w)_k / (|d| |u_k|); NaN
    where u_k = 0 or d = 0. The min-norm point has every cosine >= |d| in unit form."""
    g = np.asarray(gram, np.float64)
    w = np.asarray(w, np.float64)
    gw = g @ w
    d_norm = float(np.sqrt(max(w @ gw, 0.0)))
    norms = np.sqrt(np.maximum(np.diag(g), 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        cos = gw / (d_norm * norms)
    return np.where((norms > 0) & (d_norm > 0), cos, np.nan)


def affine_coefficients(advantages: torch.Tensor, adv_clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, b), each [K, B] float64: L_k = sum_i a_ki l_i(1) + b_ki l_i(0) for the masked reward
    losses of docs/algorithm.md §7.1 and any per-sample loss affine in r.

    With c_ki = [A_ki finite] / max(|V_k|, 1) and r_ki = r(A_ki) (`amortized_coefficients`
    with K = 1, so masks, counts and the clip are the trainer's own): a = c r, b = c (1 - r).
    A reward with no sample here has zero rows."""
    if advantages.dim() != 2:
        raise ValueError(f"advantages must be [B, K], got {tuple(advantages.shape)}")
    a, b = [], []
    for k in range(advantages.shape[1]):
        r, c = amortized_coefficients(advantages[:, k:k + 1], [1.0], adv_clip, True)
        r, c = r.double(), c.double()
        a.append(c * r)
        b.append(c * (1.0 - r))
    return torch.stack(a), torch.stack(b)
