"""The MGDA min-norm problem on the simplex (docs/algorithm.md §7.3), solved exactly.

min over alpha in the simplex of alpha^T G alpha, G a K x K PSD Gram matrix of (normalised)
gradients. For K <= ENUM_MAX_K every support S is enumerated: on S the KKT conditions are
the linear system G_SS a = lam 1, 1^T a = 1, solved by least squares (which also handles
singular G_SS: duplicates, zero rows, rank deficiency). The best feasible candidate is the
optimum. Larger K uses away-step Frank-Wolfe with a duality-gap stop, polished by the
same KKT solve on the support it finds.

Ties: when several alpha reach the minimum (affinely dependent gradients), the one with the
smallest Euclidean norm is returned, i.e. the most even split. It is unique, so the result
does not depend on the enumeration order (and duplicated rewards get equal weights).
"""

from __future__ import annotations

import itertools

import numpy as np

__all__ = ["min_norm_weights", "ENUM_MAX_K"]

ENUM_MAX_K = 10  # 2^10 - 1 = 1023 small solves, a few ms
_NEG_TOL = 1e-10  # an entry above -tol counts as >= 0
_OBJ_RTOL = 1e-10  # candidates within this (relative) objective of the best are ties


def _as_gram(gram) -> np.ndarray:
    if hasattr(gram, "detach"):  # a torch tensor, without importing torch here
        gram = gram.detach().cpu().double().numpy()
    g = np.array(gram, dtype=np.float64)
    if g.ndim != 2 or g.shape[0] != g.shape[1] or g.shape[0] == 0:
        raise ValueError(f"gram must be a non-empty square matrix, got shape {g.shape}")
    if not np.all(np.isfinite(g)):
        raise ValueError("gram holds non-finite entries")
    return 0.5 * (g + g.T)


def _support_solution(g: np.ndarray, support: tuple[int, ...]) -> np.ndarray | None:
    """Min-norm solution of G_SS a = lam 1, sum a = 1 on S, embedded in R^K; None if infeasible."""
    s = list(support)
    n = len(s)
    kkt = np.zeros((n + 1, n + 1))
    kkt[:n, :n] = g[np.ix_(s, s)]
    kkt[:n, n] = -1.0
    kkt[n, :n] = 1.0
    rhs = np.zeros(n + 1)
    rhs[n] = 1.0
    sol, *_ = np.linalg.lstsq(kkt, rhs, rcond=1e-12)
    a = sol[:n]
    if not np.allclose(kkt @ sol, rhs, atol=1e-8) or np.any(a < -_NEG_TOL):
        return None
    a = np.clip(a, 0.0, None)
    total = a.sum()
    if total <= 0:
        return None
    alpha = np.zeros(g.shape[0])
    alpha[s] = a / total
    return alpha


def _enumerate(g: np.ndarray) -> np.ndarray:
    k = g.shape[0]
    best, best_obj, best_norm = None, np.inf, np.inf
    tol = _OBJ_RTOL * max(1.0, float(np.max(np.abs(np.diag(g)))))
    for size in range(1, k + 1):
        for support in itertools.combinations(range(k), size):
            alpha = _support_solution(g, support)
            if alpha is None:
                continue
            obj = float(alpha @ g @ alpha)
            norm = float(alpha @ alpha)
            better = obj < best_obj - tol
            tie_smaller_norm = abs(obj - best_obj) <= tol and norm < best_norm - 1e-12
            if better or tie_smaller_norm:
                best, best_obj, best_norm = alpha, min(obj, best_obj), norm
    if best is None:  # cannot happen for a PSD matrix (singletons are always feasible)
        raise RuntimeError("min_norm_weights: no feasible support found")
    return best


def _frank_wolfe(g: np.ndarray, tol: float = 1e-13, max_iter: int = 100_000) -> np.ndarray:
    """Away-step Frank-Wolfe (linear convergence on the simplex), then an exact polish."""
    k = g.shape[0]
    alpha = np.full(k, 1.0 / k)
    for _ in range(max_iter):
        m = g @ alpha
        a = float(alpha @ m)
        t = int(np.argmin(m))
        gap = a - m[t]  # Frank-Wolfe duality gap
        if gap <= tol:
            break
        on = np.flatnonzero(alpha > 0)
        s = int(on[np.argmax(m[on])])
        if gap >= m[s] - a:  # toward vertex t
            direction = -alpha.copy()
            direction[t] += 1.0
            gamma_max = 1.0
        else:  # away from vertex s
            direction = alpha.copy()
            direction[s] -= 1.0
            gamma_max = alpha[s] / max(1.0 - alpha[s], 1e-300)
        curv = float(direction @ g @ direction)
        slope = -float(direction @ m)
        gamma = gamma_max if curv <= 0 else min(max(slope / curv, 0.0), gamma_max)
        alpha = np.clip(alpha + gamma * direction, 0.0, None)
        alpha /= alpha.sum()
    # The support is now right: solving its KKT system removes the remaining error.
    polished = _support_solution(g, tuple(np.flatnonzero(alpha > 1e-9)))
    if polished is not None and polished @ g @ polished <= alpha @ g @ alpha:
        return polished
    return alpha


def min_norm_weights(gram) -> np.ndarray:
    """alpha on the simplex minimising alpha^T G alpha (float64 numpy [K]).

    `gram` is a K x K PSD matrix (numpy or torch). Exact for K <= ENUM_MAX_K; the returned
    alpha is the min-norm one among ties. Raises ValueError on a malformed matrix.
    """
    g = _as_gram(gram)
    k = g.shape[0]
    if k == 1:
        return np.ones(1)
    scale = float(np.max(np.abs(np.diag(g))))
    if scale <= 0:  # all-zero Gram: every alpha is optimal; the min-norm one is uniform
        return np.full(k, 1.0 / k)
    g = g / scale  # alpha is invariant to a positive scaling of G
    alpha = _enumerate(g) if k <= ENUM_MAX_K else _frank_wolfe(g)
    return alpha / alpha.sum()
