"""Assemble the report: load inputs, compute tables, draw figures, write md/html/csv."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from marble.runtime.io import atomic_path
from marble.runtime.oserrors import not_a_folder
from marble.report import figures, glance, lead, published, tables
from marble.report.verdict_frames import interval_text
from marble.report.demo_claim import demo_verdict
from marble.report.experiments import experiment_section
from marble.report.loading import (ReportInputError, RunData, eval_samples, left_out_sentence, load_bench,
                                   load_complete_runs, load_eval_summary, read_json_file)
from marble.report.provenance import provenance_table
from marble.report.render import Figure, Section, Table, Text, to_html, to_markdown
from marble.report.table1 import report_frame
from marble.report.verdict import RunTrend, reward_changes, run_line, specialist_rewards

TITLE = "MARBLE report"


@dataclass
class ReportInputs:
    runs_dir: Path
    out: Path
    eval_summary: Path | None = None
    bench: Path | None = None
    flops: Path | None = None  # `marble bench flops` JSON (counted FLOPs where no GPU ran)
    eval_dir: Path | None = None
    table1: Path | None = None  # results/eval/table1.csv: every Table 1 row, whatever its settings folder
    images_per_dataset: int = 4
    window: int | None = None  # epochs averaged at each end for the verdict (None: auto)
    min_gain: float = 0.0  # a reward "improves" when its change exceeds this
    smooth: int = 5
    # CPU-scale experiment folders (results/claim, results/zoo): their sections lead the report
    experiments: tuple[Path, ...] = ()


class Builder:
    """Collects sections while writing figures and CSVs into the (temporary) report dir."""

    def __init__(self, root: Path):
        self.root = root
        self.sections: list[Section] = []
        (root / "figures").mkdir(parents=True, exist_ok=True)
        (root / "tables").mkdir(parents=True, exist_ok=True)

    def section(self, title: str, collapsed: bool = False) -> Section:
        self.sections.append(Section(title, collapsed=collapsed))
        return self.sections[-1]

    def csv(self, name: str, frame: pd.DataFrame) -> str:
        frame.to_csv(self.root / "tables" / f"{name}.csv", index=False)
        return f"tables/{name}.csv"

    def table(self, section: Section, name: str, caption: str, frame: pd.DataFrame) -> None:
        frame.to_csv(self.root / "tables" / f"{name}.csv")
        section.blocks.append(Table(f"{caption} (`tables/{name}.csv`)", frame))

    def figure(self, section: Section, written: Path | None, caption: str, missing: str) -> None:
        if written is None:
            section.blocks.append(Text(missing))
        else:
            section.blocks.append(Figure(caption, written.relative_to(self.root)))


def run_trends(runs: list[RunData], window: int | None, min_gain: float) -> list[RunTrend]:
    return [RunTrend(r.name, r.balancer, reward_changes(r.metrics, r.reward_names, window, min_gain))
            for r in runs]


def all_specialists(runs: list[RunData]) -> dict[str, float]:
    found: dict[str, float] = {}
    for run in runs:
        if run.config.get("stages"):
            # A staged run logs a reward only in its stages: its shares measure stage lengths,
            # not applicability (a generalist of a short stage would read as a specialist).
            continue
        for name, share in specialist_rewards(run.metrics, run.reward_names).items():
            found[name] = min(share, found.get(name, 1.0))
    return found


def _verdict_section(b: Builder, data: dict) -> None:
    """The claim's questions answered one line each, their numbers drawn with intervals
    (marble.report.glance), then the sentences with every interval; the per-balancer and
    per-run detail goes to a collapsed section further down."""
    s = b.section("Verdict")
    s.blocks += glance.verdict_blocks(data, b.root)
    for line in data["sentences"]:
        s.blocks.append(Text(line))


def balancer_change_frame(data: dict, specialists: dict[str, float]) -> pd.DataFrame:
    """balancer x reward: the change's measure and mean [95% interval] over seeds."""
    return pd.DataFrame([{"balancer": bal, "reward": r, "specialist": r in specialists,
                          "measure": v["measure"], "seeds": len(v["seeds"]), "change": iv["mean"],
                          "low": iv["low"], "high": iv["high"], "interval": interval_text(iv)}
                         for bal, v in data["reward_change_by_balancer"].items()
                         for r, iv in v["change"].items()])


def _verdict_details(b: Builder, trends, specialists, inp: ReportInputs, data: dict) -> None:
    s = b.section("Details: the verdict per balancer and per run", collapsed=True)
    table = balancer_change_frame(data, specialists)
    if not table.empty:
        b.table(s, "reward_change_by_balancer", "Each reward's change per balancer: mean and 95% "
                "Student-t interval over seeds (runs of one balancer and seed averaged into one "
                "sample); `measure`: held-out (eval.jsonl) when every run of the balancer has one, "
                "else the training reward", table)
    spec = ", ".join(f"`{k}` ({v:.0%} of rollouts)" for k, v in specialists.items()) or "none"
    s.blocks.append(Text(
        f"Specialist rewards (applicable to a strict subset of rollouts): {spec}. Held-out change: "
        f"{data['change_measures']['held-out']}. Training change: the mean of a run's last logged "
        f"epochs minus the mean of its first "
        f"({'auto: a quarter of the epochs, 1 to 5' if inp.window is None else inp.window} epochs); "
        f"per run below, it counts as improving when it exceeds {inp.min_gain:g}."
    ))
    for t in trends:
        s.blocks.append(Text(run_line(t, specialists)))
    if trends:
        b.table(s, "training_reward_change", "Training reward change per run",
                tables.training_change_table(trends))
    if data["heldout_change"]:
        b.table(s, "heldout_change", "Held-out change per run (eval.jsonl: last evaluation "
                "minus step 0, EMA weights, latents fixed per seed and prompt)",
                pd.DataFrame(data["heldout_change"]).T.rename_axis("run"))


def _eval_section(b: Builder, inp: ReportInputs) -> pd.DataFrame | None:
    s = b.section("Details: evaluation scores per run (Table 1 style)", collapsed=True)
    summary = load_eval_summary(inp.eval_summary)
    if summary is None or summary.empty:
        s.blocks.append(Text(
            f"Missing: no evaluation summary at `{inp.eval_summary or '(not given: --eval-summary)'}`. "
            "Make it with `marble evaluate ...` per run and checkpoint, then `python -m "
            "marble.evaluation.summary --eval-dir results/eval --out-csv results/eval/summary.csv "
            "--out-md results/eval/table.md` (or `snakemake -c2 eval_only --configfile <your config>`, "
            "`--profile slurm` on a cluster)."
        ))
        return None
    wide = tables.eval_table(summary)
    b.table(s, "eval_scores", "Per-reward eval scores of each run's latest evaluated checkpoint; "
            "composite = mean of column-wise z-scores (population std) over these rows", wide)
    return wide


def _paper_section(b: Builder, runs: list[RunData], evals: pd.DataFrame | None) -> None:
    s = b.section("Details: Table 1 per balancer, and as published", collapsed=True)
    s.blocks.append(Text(
        "The paper's numbers are SD3.5-M at 512 px with five model-based rewards; this run's are "
        "the tiny model with toy rewards (brightness and saturation stand in for the general "
        "rewards, text contrast for OCR, colour match for GenEval). Compare directions and "
        f"orderings, not values. Source of every `published` column: {published.SOURCE}."))
    # This run beside the published rows is the lead's Table 1 (marble.report.table1.build).
    b.table(s, "table1_published", f"Table 1 as published ({published.SOURCE})", published.table1())


def _training_sections(b: Builder, runs: list[RunData], inp: ReportInputs) -> None:
    s = b.section("Training curves")
    b.figure(s, figures.training_curves(runs, b.root / "figures" / "training_rewards.png", inp.smooth),
             "Per-reward training reward, one panel per reward, one line per run: colour = balancer, "
             "line style = seed",
             "No `reward/<name>` values in any metrics.jsonl.")
    s = b.section("Reward weights (alpha)")
    b.figure(s, figures.alpha_trajectories(runs, b.root / "figures" / "alpha.png"),
             "alpha_k per logged step, one panel per run: the alpha each step applied, a dot where "
             "the step ran a full solve, the EMA cache dashed",
             "No run logged `alpha/<name>` (set `balancer.diagnostics_every` > 0).")


def _harmony_figures(b: Builder, runs: list[RunData], by_run: pd.DataFrame, data: dict) -> None:
    s = b.section("Gradient harmony")
    if by_run.empty or by_run["logged_steps"].sum() == 0:
        s.blocks.append(Text("Missing: no run logged `cos_min` (diagnostic steps come every "
                             "`balancer.diagnostics_every` optimizer steps; 0 turns them off)."))
        return
    b.figure(s, figures.cosine_distribution(runs, b.root / "figures" / "worst_cosine.png"),
             "Worst-reward cosine min_k cos(d, g_k) per balancer: its distribution over every "
             "diagnostic step of every seed, the applied direction beside the weighted-sum "
             "direction on the same batches", "")
    b.figure(s, figures.anti_aligned_intervals(
        data["anti_aligned_by_balancer"], data["anti_aligned_weighted_sum_direction_by_balancer"],
        data["anti_aligned_published"], b.root / "figures" / "anti_aligned.png"),
        "Fraction of diagnostic steps with an anti-aligned reward per balancer, mean and 95% "
        "interval over seeds (per run: the collapsed harmony table below)",
        "No balancer with a seeded run logged `anti_aligned`.")


def _harmony_tables(b: Builder, runs: list[RunData], by_run: pd.DataFrame) -> None:
    if by_run.empty or by_run["logged_steps"].sum() == 0:
        return
    s = b.section("Details: gradient harmony per run", collapsed=True)
    b.table(s, "harmony_by_run", "Per run: mean worst-reward cosine, mean across-reward variance "
            "of the cosine, anti-aligned fraction; `applied` = the direction the balancer applied, "
            "`ws_dir` = the weighted-sum direction on the same batches; a step's `anti_aligned` is "
            "the mean over its diagnostic micro-batches, so the fraction counts batches; "
            "`*_solve` / `*_amortized`: the applied direction on steps whose diagnostic "
            "micro-batch was a full solve (fresh alpha) / used the cached alpha", by_run)
    b.table(s, "harmony_by_balancer", "Pooled per balancer, beside the published values "
            "(`published_*` columns, MARBLE project page: weighted sum 80% anti-aligned, min cos "
            "-0.13, var 0.161; MARBLE 0%, +0.37, 0.006)",
            tables.harmony_by_balancer(runs))


def _cost_section(b: Builder, inp: ReportInputs) -> None:
    s = b.section("Details: the bench, every row", collapsed=True)
    bench = load_bench(inp.bench)
    if bench is None:
        s.blocks.append(Text(
            f"Missing: no bench results at `{inp.bench or '(not given: --bench)'}`. Make them with "
            "`marble bench step --preset tiny --json results/bench/step.json`."
        ))
        return
    b.table(s, "cost", "Step time and peak memory (`peak_gpu_memory_mb` on a GPU bench; on a CPU "
            "bench `peak_cpu_rss_mb`, the process's resident set, not comparable to the paper's GPU "
            "memory); relative speed = 1 / time ratio vs the weighted "
            "sum; `published_*` columns: the paper's cost table (MARBLE project page, 8xH200, "
            "K = 5): weighted sum 1.00x / 59 GB, MARBLE (amortized, N = 10) 0.97x / 67 GB, "
            "without amortization 0.56x / 67 GB", tables.cost_table(bench))


def _rho_section(b: Builder, runs, trends, evals) -> None:
    s = b.section("Details: rho ablation groups", collapsed=True)
    groups = tables.rho_groups(runs)
    if not groups:
        s.blocks.append(Text("Not applicable: no two MARBLE runs differ only in `balancer.alpha_ema` "
                             "(or `balancer.exact_masking`). Train the presets rho_01 / rho_03 / "
                             "rho_05 / rho_07 / rho_09 (`snakemake --profile slurm rho_ablation "
                             "--configfile config/paper.yaml site.yaml`) "
                             "to get this table. "
                             "Paper: rho = 0.7 is best on every metric (0.1 worst)."))
        return
    by_name = {t.run: t for t in trends}
    for i, group in enumerate(groups):
        b.table(s, f"rho_ablation_{i}", "Runs differing only in rho = `balancer.alpha_ema` "
                "and/or `balancer.exact_masking` (ours; the paper's runs use the reference's "
                "r = 1/2 fill) "
                "(eval scores when evaluated, else the last training rewards)",
                tables.rho_table(group, by_name, evals))


def _provenance_section(b: Builder, runs: list[RunData], inp: ReportInputs) -> None:
    s = b.section("Details: provenance (code and libraries)", collapsed=True)
    b.table(s, "provenance", "Git commit (12 characters), uncommitted changes and library "
            "versions of every run folder and of the evaluation folders (identical ones "
            "grouped); each folder's `provenance.json` also holds its resolved config",
            provenance_table(runs, inp.eval_dir))


def _table1_blocks(inp: ReportInputs) -> list:
    """The merged Table 1 (the table1 rule's csv: public and trained rows, each evaluated under
    its own protocol in its own settings folder), when the workflow wrote one."""
    if inp.table1 is None or not inp.table1.is_file():
        return []
    return [Table(f"Table 1, every row: each cell ours / published, each row under its own protocol "
                  f"(`{inp.table1}`; `–`: not evaluated)", report_frame(inp.table1))]


def _samples_section(b: Builder, runs: list[RunData], inp: ReportInputs) -> None:
    s = b.section("Samples", collapsed=True)
    if inp.eval_dir is None or not inp.eval_dir.is_dir():
        s.blocks.append(Text(
            f"Missing: no eval folder at `{inp.eval_dir or '(not given: --eval-dir)'}`. Evaluate "
            "with `marble evaluate ... --save_images --output_dir results/eval/<run>/<ckpt>/<dataset>`."
        ))
        return
    for run in tqdm(runs, desc="image grids", disable=len(runs) < 2):
        samples = eval_samples(inp.eval_dir, run.name, inp.images_per_dataset)
        b.figure(s, figures.image_grid(run.name, samples, b.root / "figures" / f"samples_{run.name}.png"),
                 f"`{run.name}`: first {inp.images_per_dataset} eval images per dataset (latest checkpoint)",
                 f"Missing: no eval images for `{run.name}` under `{inp.eval_dir / run.name}`.")


def build_report(inp: ReportInputs) -> dict:
    """Write report.md, report.html, figures/, tables/ and verdict.json under `inp.out`,
    all at once (built in a temporary sibling, then renamed); returns the verdict's data."""
    _check_out(inp.out)
    runs, left_out = load_complete_runs(inp.runs_dir)  # a run still training is named, never averaged in
    trends = run_trends(runs, inp.window, inp.min_gain)
    specialists = all_specialists(runs)
    with atomic_path(inp.out) as tmp:
        b = Builder(tmp)
        # The answer first, in one screen (issue 41): the verdict with its intervals drawn,
        # then what was run; the experiments' verdicts (marble.report.experiments), the
        # paper's tables beside ours, the figures; the long per-run tables last, collapsed.
        data = demo_verdict(runs, trends, specialists)
        data["runs_left_out"] = left_out
        if left_out:
            data["sentences"].append(left_out_sentence(left_out))
        if runs:
            _verdict_section(b, data)
            b.section("What was run").blocks += glance.what_was_run(runs)
        b.sections += [experiment_section(folder, tmp) for folder in inp.experiments]
        if not runs:
            b.section("Runs").blocks.append(Text(
                f"Missing: no complete run folder with a metrics.jsonl under `{inp.runs_dir}`. Train with "
                "`marble train --preset tiny --output-dir results/runs/<run>`. "
                + (left_out_sentence(left_out) or "")))
        long_eval = load_eval_summary(inp.eval_summary)
        toy = not runs or not all(lead.is_paper_scale(r) for r in runs)
        frames = lead.paper_frames(runs, long_eval, load_bench(inp.bench), read_json_file(inp.flops))
        title = lead.LEAD_TITLE + (" (toy analogues)" if toy else "")
        lead_section = b.section(title)
        lead_section.blocks += _table1_blocks(inp)
        lead_section.blocks += lead.lead_blocks(frames, tmp, toy, b.csv)
        _training_sections(b, runs, inp)
        by_run = tables.harmony_by_run(runs)
        _harmony_figures(b, runs, by_run, data)
        evals = _eval_section(b, inp)
        _paper_section(b, runs, evals)
        _verdict_details(b, trends, specialists, inp, data)
        _harmony_tables(b, runs, by_run)
        _cost_section(b, inp)
        _rho_section(b, runs, trends, evals)
        _provenance_section(b, runs, inp)
        _samples_section(b, runs, inp)
        (tmp / "report.md").write_text(to_markdown(TITLE, b.sections), encoding="utf-8")
        (tmp / "report.html").write_text(to_html(TITLE, b.sections, tmp), encoding="utf-8")
        (tmp / "verdict.json").write_text(json.dumps(
            {**data, "specialists": specialists, "runs": [run_line(t, specialists) for t in trends]},
            indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return data


# What build_report writes: a folder holding only these is an earlier report.
REPORT_ENTRIES = frozenset({"report.md", "report.html", "verdict.json", "figures", "tables"})


def _check_out(out: Path) -> None:
    """The whole folder is replaced: refuse one that holds anything a report does not write.
    Judged by every entry, not by report.md alone: Snakemake deletes the declared outputs
    (report.md, report.html) before a rerun and leaves figures/, tables/ and verdict.json."""
    problem = not_a_folder(out, "--out")  # a file there failed only at the final rename, in a traceback
    if problem:
        raise ReportInputError(problem)
    foreign = sorted(p.name for p in out.iterdir() if p.name not in REPORT_ENTRIES) if out.is_dir() else []
    if foreign:
        raise FileExistsError(f"--out {out}: holds {', '.join(foreign[:5])}, which no report "
                              "writes; refusing to replace it (pick another --out)")
