"""The report section "The claim at CPU scale" (claim.md) from a claim verdict
(marble.experiments.claim_experiment): the shared frames (marble.report.verdict_frames) plus the
experiment's own (levels, beyond the paper, replication and multiplicity).
"""

from __future__ import annotations

import pandas as pd

from marble.report.render import markdown_table
from marble.report.verdict_frames import (PAPER, anti_frame, change_frame, cost_frame, interval_text, num,
                                          paired_frame, power_lines)


def beyond_frame(v: dict) -> pd.DataFrame:
    """arm: issue 37's question beyond the paper (marble.report.claim_beyond), one row per arm."""
    parts = v.get("arms_versus_baseline") or {}
    rows = [[interval_text(p["micro_anti_aligned"], pct=True), num(p["worst_micro_cosine"], "+.3f"),
             f"x{num(p['flops_ratio_without_diagnostics'], '.4f')}", str(p["a_every_reward_rises"]),
             str(p["b_specialists_rise_more"]), str(p["c_less_anti_aligned"]), "yes" if p["answer"] else "no"]
            for p in parts.values()]
    cols = ["micro-steps anti-aligned", "worst micro-step cosine", "FLOPs vs weighted sum (no diagnostics)",
            "(a)", "(b) vs weighted sum", "(c) vs weighted sum", "all four"]
    return pd.DataFrame(rows, index=pd.Index(list(parts), name="arm"), columns=cols)


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
        text = "; ".join(f"{m} p_holm {num(x['p_holm'], '.3g')}" for m, x in members.items())
        out.append(f"- Holm, {family}: {text}.")
    for s, e in ((v.get("multiplicity") or {}).get("b_equivalence") or {}).items():
        out.append(f"- (b) {s} equivalent within +-{num(e['margin'], '.3g')} (TOST, Holm): "
                   f"{e['equivalent']} (p {num(e['p_holm'], '.3g')}).")
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
