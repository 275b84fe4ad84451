"""The torchjd weightings the `gramian` balancer takes by name (torch- and torchjd-free data).

Each entry names the public torchjd class that computes weights, what it reads (the K x K
Gramian, or a K x K factor F with F F^T = Gramian for the weightings torchjd defines on a
matrix), its default options, whether its weights lie on the simplex, its source paper
and what the amortized form (the weights of the last solve, EMA-smoothed, held between
solves) means for it. docs/balancers.md prints this table; nothing here imports torchjd.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["WeightingSpec", "WEIGHTINGS", "weighting_names", "unknown_weighting"]

# The amortized form of a weighting that is a function of the Gramian alone: at a solve,
# w = f(G) exactly as the full step uses it; between solves, the EMA of those w applied to
# the current per-reward losses (sum_k w_k L_k, one backward), as MARBLE does with alpha.
_FIXED_POINT = "the last solve's w = f(G), EMA-smoothed, applied as sum_k w_k L_k"


@dataclass(frozen=True)
class WeightingSpec:
    torchjd_class: str  # a public name of torchjd.aggregation
    reads: str  # "gramian": f(G); "matrix": f(F) with F F^T = G (torchjd's Matrix weightings)
    options: dict = field(default_factory=dict)  # torchjd's constructor defaults we pick
    simplex: bool = False  # weights >= 0 summing to 1 for every Gramian
    paper: str = ""
    amortized: str = _FIXED_POINT
    # the class is an aggregator whose `.weighting` is the weighting (no public Weighting)
    aggregator: bool = False
    # A min-norm solver (the full-solve theorem holds for it): how far below 0 its own solve's
    # worst cosine may sit; None: not a min-norm point, the theorem does not apply.
    min_norm_tol: float | None = None


WEIGHTINGS: dict[str, WeightingSpec] = {
    # torchjd's MGDA is Frank-Wolfe stopped at a step below epsilon = 1e-3 (not our exact QP):
    # its point is near the min-norm one, so the theorem is checked at that tolerance.
    "mgda": WeightingSpec("MGDAWeighting", "gramian", simplex=True, min_norm_tol=1e-3,
                          paper="Desideri 2012; Sener & Koltun, NeurIPS 2018 (arXiv 1810.04650)"),
    "upgrad": WeightingSpec("UPGradWeighting", "gramian",
                            paper="Quinton & Rey, arXiv 2406.16232 (2024)"),
    "cagrad": WeightingSpec("CAGradWeighting", "gramian", {"c": 0.5},
                            paper="Liu et al., NeurIPS 2021 (arXiv 2110.14048)"),
    "nash_mtl": WeightingSpec(
        "NashMTL", "matrix", {"max_norm": 1.0, "optim_niter": 20}, aggregator=True,
        paper="Navon et al., ICML 2022 (arXiv 2202.01017)",
        # Stateful: each solve warm-starts from the previous solution (torchjd keeps it,
        # one state per set of rewards present, checkpointed); holding w for N steps is the
        # paper's own `update_weights_every` option, here with the EMA on top.
        amortized="the bargaining solution of the last solve (warm-started from the one "
                  "before), EMA-smoothed, held between solves: Nash-MTL's update_weights_every"),
    "imtl_g": WeightingSpec("IMTLGWeighting", "gramian",
                            paper="Liu et al., ICLR 2021 (IMTL, openreview 7UyqgFhPqAd)"),
    "dualproj": WeightingSpec("DualProjWeighting", "gramian",
                              paper="Quinton & Rey, arXiv 2406.16232 (2024)"),
    "aligned_mtl": WeightingSpec("AlignedMTLWeighting", "gramian",
                                 paper="Senushkin et al., CVPR 2023 (arXiv 2305.19000)"),
    "pcgrad": WeightingSpec(
        "PCGradWeighting", "gramian", paper="Yu et al., NeurIPS 2020 (arXiv 2001.06782)",
        # PCGrad's projections are pairwise and in a random order: the weights torchjd
        # returns are the coefficients of the projected sum in the g_k, not a fixed point.
        amortized="the last solve's projection coefficients (seeded random order) as fixed "
                  "weights: between solves nothing is projected, the current gradients are "
                  "combined with the old coefficients"),
    "random": WeightingSpec(
        "RandomWeighting", "matrix", simplex=True,
        paper="Lin et al., TMLR 2022 (arXiv 2111.10603)",
        amortized="one softmax(N(0, I)) draw per solve (seeded by step), EMA-smoothed, held "
                  "between solves (RLW draws every step)"),
    "fairgrad": WeightingSpec("FairGradWeighting", "gramian", {"alpha": 1.0},
                              paper="Ban & Ji, ICML 2024 (arXiv 2402.15638)"),
}


def weighting_names() -> tuple[str, ...]:
    return tuple(WEIGHTINGS)


def unknown_weighting(name) -> str | None:
    """One line when `name` is not a weighting of the table, else None."""
    if name in WEIGHTINGS:
        return None
    return f"balancer.weighting = {name!r}: expected one of {', '.join(WEIGHTINGS)}"
