"""The frames of a claim verdict (verdict.json, marble.experiments.claim_experiment) and its intervals as text.

The tables are frames (`change_frame`, `anti_frame`, `cost_frame`): the experiment's claim.md
renders them as Markdown (marble.experiments.claim_markdown), and `marble report` shows the same
frames in its section (marble.report.experiments): the report reads the experiment's file
format, never its code, so the product imports nothing of marble.experiments.
"""

from __future__ import annotations

import math

import pandas as pd

from marble.config_balancers import BALANCERS

PAPER = "published (MARBLE project page): weighted sum 80%, MARBLE 0%"


def interval_text(d: dict | None, pct: bool = False, digits: int = 3, clip: bool = True) -> str:
    """An interval's JSON ({mean, low, high}) as "mean [low, high]" (percent with `pct`)."""
    if not d or d.get("mean") is None:
        return "n/a"
    # a fraction's t-interval can leave [0, 1]; shown clipped (verdict.json keeps it as computed)
    lo, hi = (0.0, 1.0) if clip else (-1.0, 1.0)  # a difference of fractions may be < 0
    f = ((lambda x: f"{100 * min(max(x, lo), hi):+.0f}%" if not clip else f"{100 * min(max(x, lo), hi):.0f}%")
         if pct else (lambda x: f"{x:+.{digits}g}"))
    if d.get("low") is None:
        return f"{f(d['mean'])} (1 seed)"
    return f"{f(d['mean'])} [{f(d['low'])}, {f(d['high'])}]"


def num(x, fmt: str) -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


def change_frame(v: dict) -> pd.DataFrame:
    """arm x reward: the change's mean [95% interval] over seeds (specialists marked)."""
    rewards = v["rewards"]
    cols = [f"{r}{' (specialist, %.0f%%)' % (100 * v['specialists'][r]) if r in v['specialists'] else ''}"
            for r in rewards]
    rows = [[interval_text(v["arm_results"][arm]["change"].get(r)) for r in rewards] for arm in v["arms"]]
    return pd.DataFrame(rows, index=pd.Index(v["arms"], name="arm"), columns=cols)


def paired_frame(v: dict) -> pd.DataFrame:
    """arm x reward: the arm's change minus the baseline arm's, paired by seed [95% interval]."""
    rows, arms = [], [a for a in v["arms"] if "vs_baseline" in v["arm_results"][a]]
    for arm in arms:
        rows.append([interval_text(v["arm_results"][arm]["vs_baseline"].get(r)) for r in v["rewards"]])
    return pd.DataFrame(rows, index=pd.Index(arms, name=f"arm minus {v['baseline_arm']}"),
                        columns=list(v["rewards"]))


def anti_frame(v: dict) -> pd.DataFrame:
    """arm: anti-aligned fractions (applied, by step kind, and the diagnostics' counterfactuals)."""
    published, rows = v["published_anti_aligned"], []
    for arm in v["arms"]:
        a = v["arm_results"][arm]["anti_aligned"]
        s = v["arm_settings"].get(arm, {})
        method = s.get("method") or ""
        pub = published.get(method)
        # a solve every N steps, an EMA'd weighting (the method's descriptor)
        cached = method in BALANCERS and BALANCERS[method].cached
        rows.append([s.get("amortize_every") if cached else "-",
                     s.get("alpha_ema") if cached else "-",
                     *(interval_text(a[k], True) for k in ("applied", "full_solve", "amortized",
                                                           "fresh_solve", "alpha_unit", "alpha_raw")),
                     interval_text(v["arm_results"][arm]["angles"]["angle_applied_solve"]),
                     "-" if pub is None else f"{100 * pub:.0f}%"])
    cols = ["N", "alpha EMA", "applied", "full-solve steps", "amortized steps",
            "fresh solve, same gradients", "applied alpha, solve's form",
            "applied alpha, raw gradients", "angle applied vs solve (deg)", "published"]
    return pd.DataFrame(rows, index=pd.Index(v["arms"], name="arm"), columns=cols)


def cost_frame(v: dict) -> pd.DataFrame:
    """arm: counted FLOPs, their ratio to a weighted-sum run, full solves, CPU seconds."""
    rows = []
    for arm in v["arms"]:
        c = v["cost"].get(arm, {})
        ratio = c.get("flops_ratio")
        rows.append([num(c.get("counted_flops"), ".3e"),
                     f"{'x' if ratio is not None else ''}{num(ratio, '.2f')}",
                     num(c.get("full_solve_micro_steps"), "d"), interval_text(c.get("cpu_s"), digits=4).lstrip("+")])
    cols = ["counted FLOPs (marble bench flops)", "vs a weighted-sum run", "full-solve micro-steps",
            "CPU seconds per run"]
    return pd.DataFrame(rows, index=pd.Index(v["arms"], name="arm"), columns=cols)


def _powered(p: dict) -> str:
    """'; effect of interest E: detected (MDD <= E) / not detected with these seeds (k would)'."""
    effect = p.get("effect_of_interest")
    if effect is None:
        return ""
    what = f"; effect of interest {effect:.3g} (its rule fixed before the run: docs/claim.md)"
    if p.get("powered"):
        return f"{what}: these seeds would detect a difference that size (80% power)"
    need = p.get("seeds_for_effect_of_interest")
    return f"{what}: too few seeds for a difference that size ({need or 'more than 1000'} would do)"


def power_lines(v: dict) -> list[str]:
    q = v["questions"]
    out = []
    for s, p in q["b_specialists_rise_more_under_marble"]["per_specialist"].items():
        out.append(f"- (b) {s}: paired difference {interval_text(p['difference'])}; minimal detectable "
                   f"difference at 80% power with {p['difference']['n']} seeds: "
                   f"{num(p['minimal_detectable_difference'], '.3g')}{_powered(p)}; seeds to detect the "
                   f"observed difference: {p['seeds_for_observed_effect'] or 'more than 1000'}.")
    for r, m in q["a_every_reward_rises_under_marble"]["minimal_detectable_difference"].items():
        out.append(f"- (a) {r}: minimal detectable change {num(m, '.3g')}.")
    c = q["c_marble_less_anti_aligned"]
    diff = interval_text(c["difference"], True, clip=False)
    out.append(f"- (c) anti-aligned fraction, weighted sum minus MARBLE: {diff}; "
               f"minimal detectable difference {num(c['minimal_detectable_difference'], '.2f')}{_powered(c)}.")
    t = q["theorem_full_solves_never_anti_aligned"]
    out.append(f"- Full solves: worst cosine {num(t['min_cosine'], '.3g')} over "
               f"{t['full_solve_steps']} full-solve steps (tolerance {t['tolerance']:g}).")
    for r, p in (q.get("every_reward_learnable_alone") or {}).get("per_reward", {}).items():
        out.append(f"- trained alone, {r}: change {interval_text(p['change'])}.")
    return out
