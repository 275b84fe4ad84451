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


# The headline table docs/claim.md quotes (claim_per_seed --markdown; tests/test_claim_committed.py)

def _said_bold(answer) -> str:
    """An answer in the table's words: true / false, or not shown."""
    return "**true**" if answer is True else "**false**" if answer is False else "not shown"


def _num(x, signed: bool = True) -> str:
    return "n/a" if x is None else (f"{x:+.4g}" if signed else f"{x:.3g}")


def _members(holm: dict, short: bool = False) -> str:
    """Each member of a Holm family: its mean (a section's test holds it in `difference`),
    adjusted p and answer; `short`: its answer alone."""
    def mean(m: dict):
        return m["mean"] if "mean" in m else (m.get("difference") or {}).get("mean")

    if short:
        return "; ".join(f"{name} {_said_bold(m['answer'])}" for name, m in holm.items())
    return "; ".join(f"{name} {_num(mean(m))} (p_holm {_num(m['p_holm'], False)}, {_said_bold(m['answer'])})"
                     for name, m in holm.items())


def _interval(iv: dict) -> str:
    return f"{_num(iv['mean'])} [{_num(iv['low'])}, {_num(iv['high'])}]"


def _section_rows(head: dict, short: bool = False) -> list[tuple[str, str, str]]:
    """The sweep, the control and every arm beside the baseline, one row each (`short`: a
    family's answers in the answer column, no figures)."""
    def family(members: dict, each: str) -> tuple[str, str]:
        return (_members(members, True), "") if short else (f"per {each}", _members(members))

    rows = []
    for base, sweep in (head.get("noise") or {}).get("sweep", {}).items():
        tests = {lv: t["falls_with_batch_size"] for lv, t in sweep["levels"].items()}
        rows.append((f"`{base}`'s anti-aligned share falls from micro-batch {min(map(int, sweep['arms']))} "
                     f"to {max(map(int, sweep['arms']))}", *family(tests, "level")))
    for arm, ctrl in (head.get("noise") or {}).get("control", {}).items():
        rows.append((f"`{ctrl['base_arm']}` opposes some reward more often than `{arm}` (no conflict)",
                     *family(ctrl["conflict_beyond_control"], "level")))
    for arm, part in (head.get("arms_versus_baseline") or {}).items():
        rows.append((f"`{arm}`: (a) every reward rises / (b) specialists rise more / (c) less anti-aligned",
                     f"{_said_bold(part['a_every_reward_rises'])} / {_said_bold(part['b_specialists_rise_more'])} / "
                     f"{_said_bold(part['c_less_anti_aligned'])}",
                     f"(c) {_interval(part['c_difference'])}; worst micro-step cosine "
                     f"{_num(part['worst_micro_cosine'])}"))
        for ref, members in part.get("versus", {}).items():
            rows.append((f"`{arm}` minus `{ref}`, each reward's held-out gain", *family(members, "reward")))
    return rows


def headline_rows(head: dict, short: bool = False) -> list[tuple[str, str, str]]:
    """(question, answer, figures) for every question and section of a recomputed headline."""
    q = head["questions"]
    rows = []
    if "c_marble_less_anti_aligned" in q:
        c = q["c_marble_less_anti_aligned"]
        rows.append(("(c) MARBLE's applied direction opposes some reward on fewer micro-steps",
                     _said_bold(c["answer"]), f"weighted sum minus MARBLE {_interval(c['difference'])}"))
    conflict = q.get("conflict_weighted_sum_anti_aligned")
    if conflict:
        rows.append(("the rewards conflict: the weighted sum opposes some reward", _said_bold(conflict["answer"]),
                     f"share {_interval(conflict['fraction'])}"))
    for key, text in (("a_every_reward_rises_under_marble", "(a) every reward rises under MARBLE"),
                      ("b_specialists_rise_more_under_marble", "(b) each specialist rises more under MARBLE"),
                      ("every_reward_learnable_alone", "each reward rises trained alone")):
        if key in q:
            members = q[key]["holm"]["members"]
            answer = _said_bold(q[key]["answer"]) + (f" ({_members(members, True)})" if short else "")
            rows.append((text, answer, _members(members)))
    for s, eq in head.get("b_equivalence", {}).items():
        rows.append((f"(b) {s}: within the pilot's effect of interest (TOST)", _said_bold(eq["equivalent"]),
                     f"margin {_num(eq['margin'], False)}, p_holm {_num(eq['p_holm'], False)}"))
    t = q.get("theorem_full_solves_never_anti_aligned")
    if t:
        rows.append(("full solves never oppose a reward (theorem)", _said_bold(t["answer"]),
                     f"worst cosine {_num(t['min_cosine'])} over {t['full_solve_steps']} full-solve steps"))
    rows += _section_rows(head, short)
    rows.append(("the seed halves", head["replication"], ", ".join(
        f"{k}: {v}" for k, v in head.get("replication_questions", {}).items())))
    return rows


def headline_markdown(head: dict) -> str:
    """The headline as the markdown table docs/claim.md quotes (tests/test_claim_committed.py)."""
    lines = [f"Seeds {', '.join(map(str, head['seeds']))}; arms {', '.join(head['arms'])}.", "",
             "| question | answer | figures |", "|---|---|---|"]
    return "\n".join(lines + [f"| {a} | {b} | {c} |" for a, b, c in headline_rows(head)]) + "\n"


def side_by_side_markdown(heads: dict[str, dict]) -> str:
    """Each question's answers under several runs of one design (label -> headline): the table
    docs/claim.md sets the machines side by side with; a row one run lacks says so."""
    answers = {label: {q: a for q, a, _ in headline_rows(h, short=True)} for label, h in heads.items()}
    questions = list(dict.fromkeys(q for per in answers.values() for q in per))
    lines = ["| question | " + " | ".join(heads) + " | same |", "|---|" + "---|" * (len(heads) + 1)]
    for q in questions:
        cells = [answers[label].get(q, "not run") for label in heads]
        lines.append(f"| {q} | " + " | ".join(cells) + f" | {'yes' if len(set(cells)) == 1 else '**no**'} |")
    return "\n".join(lines) + "\n"
