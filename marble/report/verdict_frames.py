"""The report section "The claim at CPU scale" from a claim verdict (marble.report.claim_experiment).

The tables are frames (`change_frame`, `anti_frame`, `cost_frame`): claim.md renders them as
Markdown, and `marble report` shows the same frames in its section (marble.report.experiments).
"""

from __future__ import annotations

import math

import pandas as pd

from marble.config_balancers import BALANCERS
from marble.report.render import markdown_table

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


def _num(x, fmt: str) -> str:
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
        rows.append([_num(c.get("counted_flops"), ".3e"),
                     f"{'x' if ratio is not None else ''}{_num(ratio, '.2f')}",
                     _num(c.get("full_solve_micro_steps"), "d"), interval_text(c.get("cpu_s"), digits=4).lstrip("+")])
    cols = ["counted FLOPs (marble bench flops)", "vs a weighted-sum run", "full-solve micro-steps",
            "CPU seconds per run"]
    return pd.DataFrame(rows, index=pd.Index(v["arms"], name="arm"), columns=cols)


def beyond_frame(v: dict) -> pd.DataFrame:
    """arm: issue 37's question beyond the paper (marble.report.claim_beyond), one row per arm."""
    parts = v.get("arms_versus_baseline") or {}
    rows = [[interval_text(p["micro_anti_aligned"], pct=True), _num(p["worst_micro_cosine"], "+.3f"),
             f"x{_num(p['flops_ratio_without_diagnostics'], '.4f')}", str(p["a_every_reward_rises"]),
             str(p["b_specialists_rise_more"]), str(p["c_less_anti_aligned"]), "yes" if p["answer"] else "no"]
            for p in parts.values()]
    cols = ["micro-steps anti-aligned", "worst micro-step cosine", "FLOPs vs weighted sum (no diagnostics)",
            "(a)", "(b) vs weighted sum", "(c) vs weighted sum", "all four"]
    return pd.DataFrame(rows, index=pd.Index(list(parts), name="arm"), columns=cols)


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
                   f"{_num(p['minimal_detectable_difference'], '.3g')}{_powered(p)}; seeds to detect the "
                   f"observed difference: {p['seeds_for_observed_effect'] or 'more than 1000'}.")
    for r, m in q["a_every_reward_rises_under_marble"]["minimal_detectable_difference"].items():
        out.append(f"- (a) {r}: minimal detectable change {_num(m, '.3g')}.")
    c = q["c_marble_less_anti_aligned"]
    diff = interval_text(c["difference"], True, clip=False)
    out.append(f"- (c) anti-aligned fraction, weighted sum minus MARBLE: {diff}; "
               f"minimal detectable difference {_num(c['minimal_detectable_difference'], '.2f')}{_powered(c)}.")
    t = q["theorem_full_solves_never_anti_aligned"]
    out.append(f"- Full solves: worst cosine {_num(t['min_cosine'], '.3g')} over "
               f"{t['full_solve_steps']} full-solve steps (tolerance {t['tolerance']:g}).")
    for r, p in (q.get("every_reward_learnable_alone") or {}).get("per_reward", {}).items():
        out.append(f"- trained alone, {r}: change {interval_text(p['change'])}.")
    return out


def levels_frame(v: dict) -> pd.DataFrame:
    """arm x level: anti-aligned fraction, worst cosine and variance [intervals], each with the
    paper's figure beside it (the verdict's `levels`)."""
    rows, index = [], []
    for arm, levels in (v.get("levels") or {}).get("arms", {}).items():
        for level, figs in levels.items():
            index.append(f"{arm} / {level}")
            rows.append([f"{interval_text(f['ours'], pct=name == 'anti_aligned_frac')} ("
                         + (f"paper {f['paper']:g})" if f["paper"] is not None else "not its direction)")
                         for name, f in figs.items()])
    return pd.DataFrame(rows, index=pd.Index(index, name="arm / level"),
                        columns=["anti-aligned", "min cos", "variance"])


def design_lines(v: dict) -> list[str]:
    """Replication, Holm families and equivalence, the pilot: one line each."""
    out = []
    rep = v.get("replication")
    if rep:
        out.append(f"- Replication on seed sets {rep['seed_sets'][0]} and {rep['seed_sets'][1]}: "
                   f"{rep['status']}.")
        for q, r in rep.get("questions", {}).items():
            if r["status"] != "replicated":
                out.append(f"  - {q}: {r['status']} ({r['answers'][0]} / {r['answers'][1]}).")
    for family, members in ((v.get("multiplicity") or {}).get("families") or {}).items():
        text = "; ".join(f"{m} p_holm {_num(x['p_holm'], '.3g')}" for m, x in members.items())
        out.append(f"- Holm, {family}: {text}.")
    for s, e in ((v.get("multiplicity") or {}).get("b_equivalence") or {}).items():
        out.append(f"- (b) {s} equivalent within +-{_num(e['margin'], '.3g')} (TOST, Holm): "
                   f"{e['equivalent']} (p {_num(e['p_holm'], '.3g')}).")
    if "pilot" in v:
        pilot = v["pilot"]
        out.append(f"- Pilot: {pilot if isinstance(pilot, str) else 'commit ' + pilot['commit']}.")
    return out


def claim_markdown(v: dict, figures: dict[str, str]) -> str:
    seeds = ", ".join(map(str, v["seeds"]))
    lines = ["## The claim at CPU scale", "",
             f"Arms {', '.join(v['arms'])}; seeds {seeds} (independent plans: "
             f"`data.sampler_seeds: keyed`); MARBLE = `{v['marble_arm']}`, weighted sum = "
             f"`{v['baseline_arm']}`. 95% intervals over seeds (Student t); (b) and (c) paired "
             "by seed (same prompt plan, rollout noise and initial model).", ""]
    lines += [f"- {s}" for s in v["sentences"]] + ["", "### Change of each reward from the initial model",
              "", f"Change: {v['change_measure']}.", ""]
    lines += [markdown_table(change_frame(v)), ""]
    if any("vs_baseline" in v["arm_results"][a] for a in v["arms"]):
        lines += [f"Each arm against `{v['baseline_arm']}`, paired by seed (same data plan, noise "
                  "and initial model):", "", markdown_table(paired_frame(v)), ""]
    if "change" in figures:
        lines += [f"![change per reward]({figures['change']})", ""]
    lines += ["### Anti-aligned steps against the solve interval N", "",
              f"Share of diagnostic steps whose direction opposes some reward ({PAPER}).", ""]
    lines += [markdown_table(anti_frame(v)), ""]
    if "anti" in figures:
        lines += [f"![anti-aligned fraction against N]({figures['anti']})", ""]
    if (v.get("levels") or {}).get("arms"):
        q = v["levels"]["paper_quantity"]
        lines += ["### Cosines at three levels, beside the paper", "",
                  f"The paper's figures fit the `{q['level']}` level: {q['why']}", "",
                  *(["The paper's row of each method is of its own direction: "
                     + ", ".join(f"{m} `{lv}`" for m, lv in q["by_method"].items())
                     + "; a weighted-sum arm never solves, so its fresh-solve row has no paper figure.", ""]
                    if q.get("by_method") else []),
                  markdown_table(levels_frame(v)), ""]
    if v.get("arms_versus_baseline"):
        lines += ["### Beyond the paper: each arm against the weighted sum", "",
                  "Does the arm keep every reward's cosine positive on every measured micro-step (the "
                  "paper's \"consistently positive\" worst cosine, read on each micro-step's own applied "
                  "direction), at the weighted sum's cost (counted FLOPs without diagnostics within 1%), "
                  "and keep (a) and (b)? \"all four\" is yes only when each holds.", "",
                  markdown_table(beyond_frame(v)), ""]
    lines += ["### Cost", "", markdown_table(cost_frame(v)), ""]
    if "cost" in figures:
        lines += [f"![cost]({figures['cost']})", ""]
    lines += ["### Power", ""] + power_lines(v) + [""]
    if design_lines(v):
        lines += ["### Replication, multiplicity, pilot", ""] + design_lines(v) + [""]
    return "\n".join(lines)
