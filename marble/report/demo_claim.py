"""The claim's questions asked of `marble report`'s runs, answered by the claim's statistics.

`marble report` (results/report/verdict.json and its section "Verdict") asks the claim's
questions of whatever runs it is given: (a) every reward rises under MARBLE, (b) every
specialist rises more under MARBLE than under the weighted sum, (c) MARBLE's applied
direction opposes some reward on fewer steps than the weighted sum's. The statistics are
the claim experiment's, in one place (marble.report.run_measures, seed_stats): Student-t
intervals over seeds, (b) and (c) paired by seed, answers true / false / "no difference
larger than X", the minimal detectable difference. This module only turns run folders into
that module's per-(balancer, seed) measures:

- an arm is a balancer (`RunData.balancer`), a sample is a seed (config.yaml `train.seed`);
  runs of one balancer and one seed (rho variants, say) share the seed's prompt plan, noise
  and initial model, so they are averaged into one sample, never counted as independent;
  a run without `train.seed` is left out of the questions and named;
- a reward's change is the held-out change (eval.jsonl: last evaluation minus step 0,
  `claim_experiment.eval_change`) when every run a question uses has one, else every such
  run's training-reward change (`verdict.reward_changes`, the report's epoch windows): the
  two measures are never mixed within a question, and each sentence names its measure and
  the runs that forced the training measure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from marble.config_balancers import BALANCERS
from marble.report import seed_stats as cs
from marble.report.run_measures import (CHANGE_MEASURE, QUESTIONS, RunMeasure, arm_table,
                                        measure_run, question_a, question_b, question_c)
from marble.report.run_measures import has_heldout as held_out_exists
from marble.report.verdict_frames import interval_text
from marble.report.loading import RunData
from marble.report.published import PUBLISHED_ANTI_ALIGNED
from marble.report.verdict import RunTrend

MARBLE, BASELINE = "marble", "weighted_sum"
HELD_OUT, TRAINING = "held-out", "training"
MEASURES = {HELD_OUT: CHANGE_MEASURE,
            TRAINING: "training reward of the rollouts: mean of the last logged epochs minus "
                      "the first (the window of the report's training-change table)"}
Q_A, Q_B, Q_C = ("a_every_reward_rises_under_marble", "b_specialists_rise_more_under_marble",
                 "c_marble_less_anti_aligned")
NOT_ASKED = cs.no_difference(math.inf)  # a question without the runs it needs bounds nothing


def seed_of(run: RunData) -> int | None:
    return run.seed


def has_heldout(run: RunData) -> bool:
    """A finished held-out change: claim_experiment.has_heldout on the run's eval.jsonl."""
    return held_out_exists(run.evals, run.max_steps)


def _mean(values) -> float:
    return cs.t_interval(values).mean


def per_seed(measures: list[RunMeasure]) -> list[RunMeasure]:
    """One sample per (arm, seed): the runs sharing both averaged, NaN-aware."""
    groups: dict[tuple, list[RunMeasure]] = {}
    for m in measures:
        groups.setdefault((m.arm, m.seed), []).append(m)
    out = []
    for (arm, seed), g in groups.items():
        if len(g) == 1:
            out.append(g[0])
            continue
        avg = {part: {k: _mean([getattr(m, part)[k] for m in g]) for k in getattr(g[0], part)}
               for part in ("changes", "anti", "angles")}
        cos = [m.full_solve_min_cos for m in g if math.isfinite(m.full_solve_min_cos)]
        out.append(RunMeasure(arm, seed, avg["changes"], avg["anti"], avg["angles"],
                              min(cos) if cos else math.nan, sum(m.full_solve_steps for m in g),
                              sum(m.diag_steps for m in g)))
    return out


@dataclass
class Group:
    """The samples of a set of balancers under one change measure."""

    kind: str  # HELD_OUT or TRAINING
    measures: list[RunMeasure]  # one per (balancer, seed)
    without_eval: list[str]  # runs with no held-out change (they forced TRAINING)

    def seeds(self, arm: str) -> list[int]:
        return sorted({m.seed for m in self.measures if m.arm == arm})

    def text(self) -> str:
        if self.kind == HELD_OUT:
            return "held-out change (eval.jsonl: last evaluation minus step 0)"
        missing = f"; no eval.jsonl in {', '.join(self.without_eval)}" if self.without_eval else ""
        return f"training-reward change (last logged epochs minus the first{missing})"


class Runs:
    """The report's runs as the claim's measures (see the module docstring)."""

    def __init__(self, runs: list[RunData], trends: list[RunTrend]):
        self.rewards = list(dict.fromkeys(n for r in runs for n in r.reward_names))
        self.unseeded = [r.name for r in runs if seed_of(r) is None]
        self.seeded = [r for r in runs if seed_of(r) is not None]
        windows = {t.run: t.changes for t in trends}
        # per run: its held-out measure (NaN changes without eval.jsonl) and its training one;
        # seed -1 only labels a seedless run's own fractions, never a sample
        self.heldout = {r.name: measure_run(r.balancer, -1 if seed_of(r) is None else seed_of(r),
                                            r.metrics, self.rewards, r.evals, r.max_steps) for r in runs}
        self.training = {name: replace(m, changes={
            k: windows[name][k].delta if k in windows.get(name, {}) else math.nan for k in self.rewards})
            for name, m in self.heldout.items()}

    def group(self, balancers: set[str]) -> Group:
        chosen = [r for r in self.seeded if r.balancer in balancers]
        without = [r.name for r in chosen if not has_heldout(r)]
        kind = HELD_OUT if chosen and not without else TRAINING
        source = self.heldout if kind == HELD_OUT else self.training
        return Group(kind, per_seed([source[r.name] for r in chosen]), without)

    def rewards_of(self, balancer: str) -> list[str]:
        own = {n for r in self.seeded if r.balancer == balancer for n in r.reward_names}
        return [r for r in self.rewards if r in own]


def _mdd(x) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def answer_a(runs: Runs) -> tuple[dict, str]:
    g, rewards = runs.group({MARBLE}), runs.rewards_of(MARBLE)
    lead = cs.sentence(QUESTIONS[Q_A], NOT_ASKED)
    if not g.measures:
        return {"answer": NOT_ASKED, "reason": "no MARBLE run"}, f"{lead} No MARBLE run."
    q = question_a(g.measures, rewards, MARBLE)
    change = {r: iv.as_json() for r, iv in arm_table(g.measures, rewards)[MARBLE]["change"].items()}
    q.update(measure=g.kind, seeds=g.seeds(MARBLE), change=change)
    per = "; ".join(f"{r} {interval_text(change[r])} ({_word(q['per_reward'][r])}, minimal detectable "
                    f"change {_mdd(q['minimal_detectable_difference'][r])})" for r in rewards)
    return q, (f"{cs.sentence(QUESTIONS[Q_A], q['answer'])} Per reward, the {g.text()}, mean "
               f"[95% interval] over seeds {_list(g.seeds(MARBLE))}: {per}.")


def answer_b(runs: Runs, specialists: list[str]) -> tuple[dict, str]:
    g = runs.group({MARBLE, BASELINE})
    lead = cs.sentence(QUESTIONS[Q_B], NOT_ASKED)
    if not specialists:
        return {"answer": NOT_ASKED, "reason": "no specialist reward"}, f"{lead} No specialist reward."
    if not (g.seeds(MARBLE) and g.seeds(BASELINE)):
        return ({"answer": NOT_ASKED, "reason": "it needs a MARBLE and a weighted-sum run"},
                f"{lead} It needs a MARBLE and a weighted-sum run.")
    q = question_b(g.measures, specialists, MARBLE, BASELINE, {})
    paired = sorted(set(g.seeds(MARBLE)) & set(g.seeds(BASELINE)))
    q.update(measure=g.kind, paired_seeds=paired)
    per = "; ".join(
        f"{s} {interval_text(p['difference'])} ({_word(p['answer'])}, minimal detectable difference "
        f"{_mdd(p['minimal_detectable_difference'])}, seeds to detect the observed difference: "
        f"{_seeds_needed(p)})" for s, p in q["per_specialist"].items())
    return q, (f"{cs.sentence(QUESTIONS[Q_B], q['answer'])} MARBLE minus weighted sum, the "
               f"{g.text()}, paired over the seeds both balancers ran ({_list(paired)}): {per}.")


def _seeds_needed(p: dict) -> str:
    """How many seeds would detect the observed difference ("n/a": no spread to size it by)."""
    if p["seeds_for_observed_effect"] is not None:
        return str(p["seeds_for_observed_effect"])
    return "n/a" if p["difference"]["sd"] is None or not p["difference"]["mean"] else "more than 1000"


def answer_c(runs: Runs, effect_fraction: float) -> tuple[dict, str]:
    g = runs.group({MARBLE, BASELINE})  # fractions of steps: the change measure plays no part
    effect = effect_fraction * (PUBLISHED_ANTI_ALIGNED[BASELINE] - PUBLISHED_ANTI_ALIGNED[MARBLE])
    q = question_c(g.measures, MARBLE, BASELINE, effect)
    q["paired_seeds"] = sorted(set(g.seeds(MARBLE)) & set(g.seeds(BASELINE)))
    anti = {a: t["anti_aligned"] for a, t in arm_table(g.measures, []).items()}
    shown = ", ".join(f"{'weighted sum' if a == BASELINE else 'MARBLE'} "
                      f"{interval_text(anti[a]['applied'].as_json(), True)}" for a in (BASELINE, MARBLE) if a in anti)
    ws_dir = anti[MARBLE]["ws_direction"] if MARBLE in anti else None
    ws_txt = (f" (the weighted-sum direction on MARBLE's batches: {interval_text(ws_dir.as_json(), True)})"
              if ws_dir is not None and math.isfinite(ws_dir.mean) else "")
    return q, (f"{cs.sentence(QUESTIONS[Q_C], q['answer'])} Anti-aligned share of diagnostic steps, mean "
               f"[95% interval] over seeds: {shown or 'no run of either'}{ws_txt}; paired difference, "
               f"weighted sum minus MARBLE, {interval_text(q['difference'], True, clip=False)} over the "
               f"seeds both ran ({_list(q['paired_seeds'])}), minimal detectable difference "
               f"{_mdd(q['minimal_detectable_difference'])} (effect of interest {effect:.2f}: "
               f"{effect_fraction:g} of the paper's 80% - 0%); published (MARBLE project page): "
               "weighted sum 80%, MARBLE 0%.")


def by_balancer(runs: Runs) -> dict[str, dict]:
    """balancer -> its change measure, seeds, change and anti-aligned intervals over seeds."""
    out = {}
    for bal in dict.fromkeys(r.balancer for r in runs.seeded):
        g, rewards = runs.group({bal}), runs.rewards_of(bal)
        t = arm_table(g.measures, rewards)[bal]
        out[bal] = {"measure": g.kind, "seeds": g.seeds(bal),
                    "change": {r: iv.as_json() for r, iv in t["change"].items()},
                    "anti_aligned": {k: iv.as_json() for k, iv in t["anti_aligned"].items()},
                    "solve_steps": sum(m.full_solve_steps for m in g.measures)}
    return out


def step_kinds(balancers: dict[str, dict]) -> dict[str, dict]:
    """The applied direction's anti-aligned share on full-solve and on amortized steps, for
    the balancers that solve (intervals over seeds)."""
    return {bal: {"full_solve": b["anti_aligned"]["full_solve"], "amortized": b["anti_aligned"]["amortized"],
                  "solve_steps": b["solve_steps"]} for bal, b in balancers.items() if b["solve_steps"] > 0}


def _min_norm(balancer: str) -> bool:
    """Its descriptor says its full solve is the exact min-norm QP (`min_norm_tol`): only then
    does the theorem d.g_k >= |d|^2 hold (a torchjd weighting or a new method may oppose)."""
    return balancer in BALANCERS and BALANCERS[balancer].min_norm_tol is not None


def step_kind_text(kinds: dict[str, dict]) -> str:
    parts = [f"{bal}: full-solve steps {interval_text(k['full_solve'], True)} ({k['solve_steps']} steps), "
             f"amortized steps {interval_text(k['amortized'], True)}" for bal, k in kinds.items()]
    if not parts:
        return ""
    min_norm = [bal for bal in kinds if _min_norm(bal)]
    if not min_norm:
        return " Split by step kind: " + "; ".join(parts) + "."
    # Every solving balancer min-norm (the demo's): the sentence as it always read; else it names them.
    which = "" if len(min_norm) == len(kinds) else f" ({', '.join(min_norm)})"
    return (" Split by step kind: " + "; ".join(parts) + f". A fresh min-norm solve{which} cannot oppose "
            "a reward (d.g_k >= |d|^2); between solves the cached EMA alpha can.")


def demo_verdict(runs: list[RunData], trends: list[RunTrend], specialists: dict[str, float],
                 effect_fraction: float = 0.5) -> dict:
    """verdict.json of `marble report` (keys: docs/claim.md, "The demo's verdict")."""
    r = Runs(runs, trends)
    (qa, ta), (qb, tb) = answer_a(r), answer_b(r, [s for s in specialists if s in r.rewards])
    qc, tc = answer_c(r, effect_fraction)
    balancers = by_balancer(r)
    kinds = step_kinds(balancers)
    sentences = [ta, tb, tc + step_kind_text(kinds)]
    if r.unseeded:
        sentences.append(f"Left out of the questions (no `train.seed` in config.yaml): {', '.join(r.unseeded)}.")
    num = cs.json_number
    return {
        "every_reward_rises_under_marble": qa["answer"],
        "specialists_rise_more_under_marble": qb["answer"],
        "specialist_rises_more_under_marble": {s: p["answer"] for s, p in qb.get("per_specialist", {}).items()},
        "marble_less_anti_aligned": qc["answer"],
        "questions": {Q_A: qa, Q_B: qb, Q_C: qc},
        "sentences": sentences,
        "text": " ".join(cs.sentence(QUESTIONS[k], q["answer"]) for k, q in ((Q_A, qa), (Q_B, qb), (Q_C, qc))),
        "level": cs.LEVEL, "power": cs.POWER, "change_measures": MEASURES,
        "runs_without_seed": r.unseeded,
        "reward_change_by_balancer": {b: {k: v[k] for k in ("measure", "seeds", "change")}
                                      for b, v in balancers.items()},
        "anti_aligned": {n: num(m.anti["applied"]) for n, m in r.heldout.items()},
        "anti_aligned_weighted_sum_direction": {n: num(m.anti["ws_direction"]) for n, m in r.heldout.items()},
        "anti_aligned_by_balancer": {b: v["anti_aligned"]["applied"] for b, v in balancers.items()},
        "anti_aligned_weighted_sum_direction_by_balancer": {b: v["anti_aligned"]["ws_direction"]
                                                             for b, v in balancers.items()},
        "anti_aligned_published": dict(PUBLISHED_ANTI_ALIGNED),
        "anti_aligned_by_step_kind": kinds,
        "reward_change": {t.run: {c.reward: [num(c.delta), num(c.stderr)] for c in t.changes.values()}
                          for t in trends},
        "heldout_change": {run.name: {k: num(v) for k, v in r.heldout[run.name].changes.items()}
                           for run in runs if has_heldout(run)},
    }


def _word(answer) -> str:
    return {True: "true", False: "false"}[answer] if isinstance(answer, bool) else answer


def _list(seeds: list[int]) -> str:
    return ", ".join(map(str, seeds)) or "none"
