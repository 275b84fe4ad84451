"""Which kind of micro-step every micro-step of a run is, from the balancer's own schedule.

A run of `max_steps` optimizer steps has M = grad_accumulation x T_train micro-steps per
step. The real strategy objects decide, as in training, whether each one is a full solve
and whether it runs diagnostics; `micro_step_kinds` counts the kinds, which `marble bench
flops` and the workflow's GPU-hour plan (marble.workflow.cost) price with the counted FLOPs
of one micro-step of each kind.
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import numpy as np

from marble.balancers import build_balancer
from marble.config import grad_accumulation, training_timesteps
from marble.config_balancers import balancer_descriptor

__all__ = ["micro_step_kinds", "kind_row", "fresh_variant_row", "rows_for", "run_overhead"]


# Runs with the same balancer settings, rewards and length have the same cadence (seeds of one
# arm, a plan's runs): each is walked once per process (~0.4 s for a 1000-step paper run).
_KINDS: dict[tuple, Counter] = {}


def micro_step_kinds(cfg, from_step: int = 0) -> Counter:
    """Counter of (full_solve, diagnostics) over every micro-step of the run `cfg`; with
    `from_step`, of the steps from there on (a resumed run: the schedule still starts at 0)."""
    per_step = grad_accumulation(cfg) * training_timesteps(cfg)
    key = (repr(cfg.balancer), tuple(cfg.reward_names), cfg.train.max_steps, per_step, from_step)
    if key not in _KINDS:
        _KINDS[key] = _walk(cfg, per_step, from_step)
    return Counter(_KINDS[key])


def _walk(cfg, per_step: int, from_step: int) -> Counter:
    bal = build_balancer(cfg.balancer, cfg.reward_names)
    k = len(cfg.reward_names)
    kinds: Counter = Counter()
    for global_step in range(cfg.train.max_steps):
        for micro in range(per_step):
            step = SimpleNamespace(global_step=global_step, micro_index=micro)
            full = bal.wants_full_solve(step)
            if full:  # the solve's bookkeeping: the cache and `last_full` move on
                bal.solved(step, np.full(k, 1.0 / k), np.ones(k, bool), {})
            kind = (full, bal.wants_diagnostics(step))
            if global_step >= from_step:
                kinds[kind] += 1
    return kinds


def fresh_variant_row(balancer) -> str | None:
    """Issue 37's options that price their plain micro-steps with a row of their own: the
    output-space Gram (every micro-step) and MARBLE's norm-corrected amortized step."""
    if balancer.fresh == "exact":  # every micro-step, diagnostic or not: rows of its own
        return "marble_exact"
    if balancer.gram_space == "output":
        return "marble_output_gram"
    if balancer.cached_weights == "norm_corrected" and balancer.method == "marble":
        return "marble_norm_corrected"
    return None


def kind_row(method: str, full_solve_mode: str, full: bool, diagnostics: bool,
             weighting: str | None = None, variant: str | None = None) -> str:
    """The `marble bench flops` row that prices a micro-step of this kind. A zoo balancer's
    plain micro-steps have rows of their own; its diagnostic ones run the same passes as
    MARBLE's (gramian) or the weighted sum's (gdpo, reward_sum). The method's descriptor's
    `cadence` decides; an unregistered method is a KeyError, never priced as another. `variant`
    (`fresh_variant_row`) prices the plain single-backward micro-steps of issue 37's options;
    their diagnostic ones are MARBLE's passes (`marble_diag`; the output Gram's loss-head
    passes and K x K Gram add < 0.01% there, see docs/balancers.md)."""
    cadence = balancer_descriptor(method).cadence
    if variant == "marble_exact":  # a solve on every micro-step, its own passes
        return variant + ("_diag" if diagnostics else "")
    if variant is not None and not full and not diagnostics:
        return variant
    if cadence == "zoo" and not diagnostics and not (full and full_solve_mode != "retain"):
        return f"zoo_{weighting}_full" if full else f"zoo_{weighting}"
    if cadence == "advantage":
        return "weighted_sum_diag" if diagnostics else method
    if full:
        base = "mgda" if full_solve_mode == "retain" else "marble_recompute"
    else:
        base = "weighted_sum" if cadence == "weighted_sum" else "marble"
    return base + ("_diag" if diagnostics else "")


def rows_for(cfg, from_step: int = 0) -> set[str]:
    """The `marble bench flops` rows `run_overhead` needs to price the run `cfg`: one per kind
    of micro-step its cadence has, and the weighted sum's (the ratio's base)."""
    kinds = micro_step_kinds(cfg, from_step)
    method, mode, weighting = cfg.balancer.method, cfg.balancer.full_solve, cfg.balancer.weighting
    variant = fresh_variant_row(cfg.balancer)
    return {kind_row(method, mode, *kind, weighting, variant) for kind in kinds} | {"weighted_sum"}


def run_overhead(cfg, row_flops: dict[str, float], from_step: int = 0) -> dict:
    """Whole-run FLOPs of `cfg`'s cadence over its max_steps (from `from_step` on), relative
    to a weighted-sum run of the same length without diagnostics (`overhead` = ratio - 1)."""
    kinds = micro_step_kinds(cfg, from_step)
    method, mode, weighting = cfg.balancer.method, cfg.balancer.full_solve, cfg.balancer.weighting
    variant = fresh_variant_row(cfg.balancer)
    missing = rows_for(cfg, from_step) - set(row_flops)
    if missing:
        raise KeyError(f"pricing run {cfg.preset!r} needs rows {sorted(missing)}")
    total = sum(n * row_flops[kind_row(method, mode, full, diag, weighting, variant)]
                for (full, diag), n in kinds.items())
    micro_steps = sum(kinds.values())
    base = micro_steps * row_flops["weighted_sum"]
    ratio = total / base if base else 1.0  # nothing left to train: no overhead either
    return {"preset": cfg.preset, "method": method, "full_solve": mode,
            "max_steps": cfg.train.max_steps, "micro_steps": micro_steps,
            "full_solves": sum(n for (full, _), n in kinds.items() if full),
            "diagnostic_micro_steps": sum(n for (_, diag), n in kinds.items() if diag),
            "flops": total, "ratio": ratio, "overhead": ratio - 1.0}
