"""Figures that read (issue 41 item 2): no legend over data, colours by balancer and line
styles by seed, alpha labels true to what the balancer did, the worst cosine summarised per
balancer, the verdict drawn with its intervals, `marble report summary`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.transforms import Bbox
from test_report import DOWN, MARBLE_DIAG, UP, WS_DIAG, write_run

from marble.report import figures, glance
from marble.report.build import ReportInputs, build_report
from marble.report.cli import main
from marble.report.loading import load_runs
from marble.config_balancers import BALANCERS
from marble.report.palette import balancer_look, balancer_order, known_balancers, seed_styles

ROOT = Path(__file__).resolve().parents[1]
SOLVE_STEPS = {2, 8}  # the MARBLE runs' full-solve steps (warm-up, then every N)


@pytest.fixture
def kept(monkeypatch) -> list:
    """Figures the code under test closes, kept open for inspection."""
    found: list = []
    close = plt.close
    monkeypatch.setattr(plt, "close", found.append)
    yield found
    for fig in found:
        close(fig)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three balancers x two seeds, as the demo trains them; MARBLE logs its full solves."""
    root = tmp_path_factory.mktemp("runs")
    for seed in (1, 2):
        tail = "" if seed == 1 else f"_s{seed}"
        write_run(root, f"weighted_sum{tail}", "weighted_sum", {"bright": UP, "sat": UP, "color": DOWN},
                  diag=WS_DIAG, seed=seed)
        write_run(root, f"equal_alpha{tail}", "equal_alpha", {"bright": UP, "sat": DOWN, "color": UP},
                  diag=WS_DIAG, alphas=True, seed=seed)
        write_run(root, f"marble{tail}", "marble", {"bright": UP, "sat": UP, "color": UP},
                  diag=MARBLE_DIAG, alphas=True, seed=seed)
    loaded = load_runs(root)
    for run in loaded:  # every balancer logs `full_solve` (marble.balancers.strategies)
        solves = run.metrics["step"].isin(SOLVE_STEPS) & (run.balancer == "marble")
        run.metrics["full_solve"] = solves.astype(float)
    return loaded


def _overlap(a: Bbox, b: Bbox) -> float:
    inter = Bbox.intersection(a, b)
    return 0.0 if inter is None else inter.width * inter.height


def assert_no_legend_over_data(fig) -> None:
    """Every legend (the figure's and any axes') outside every visible axes' data area."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    assert legends, "a figure with several series needs a legend"
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            if ax.get_visible():
                assert _overlap(box, ax.get_window_extent(renderer)) < 1.0, (legend, ax.get_title())


def test_training_curves_colour_by_balancer_style_by_seed_legend_below(runs, tmp_path, kept):
    assert figures.training_curves(runs, tmp_path / "t.png") is not None
    (fig,) = kept
    assert_no_legend_over_data(fig)
    styles = seed_styles([r.seed for r in runs])
    by_name = {r.name: r for r in runs}
    for ax in fig.axes:
        bold = [line for line in ax.lines if line.get_label().lstrip("_") in by_name]
        assert len(bold) == len(runs)
        for line in bold:
            run = by_name[line.get_label().lstrip("_")]
            assert line.get_color() == balancer_look(run.balancer).color
            assert line.get_linestyle() == {"-": "-", "--": "--"}[styles[run.seed]]
        assert ax.get_legend() is None  # one legend for the figure, below the panels
    (legend,) = fig.legends
    texts = [t.get_text() for t in legend.get_texts()]
    labels = [BALANCERS[b].label for b in ("weighted_sum", "equal_alpha", "marble")]
    assert texts == [*labels, "seed 1", "seed 2"]  # not 12 run entries


def test_alpha_labels_say_what_each_balancer_did(runs, tmp_path, kept):
    assert figures.alpha_trajectories(runs, tmp_path / "a.png") is not None
    (fig,) = kept
    assert_no_legend_over_data(fig)
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert not any("(solve)" in t for t in texts), texts
    titles = {ax.get_title(): ax for ax in fig.axes if ax.get_visible()}
    equal = [t for t in titles if t.startswith("equal_alpha")]
    assert equal and all("never solves" in t for t in equal)
    (marble_title,) = [t for t in titles if t.startswith("marble:")]
    assert "solves every N steps" in marble_title
    # the solve markers sit on the steps that solved, and only there
    markers = [line for line in titles[marble_title].lines if line.get_marker() == "o"]
    assert markers and all(set(line.get_xdata()) == SOLVE_STEPS for line in markers)
    for title in equal:
        assert not [line for line in titles[title].lines if line.get_marker() == "o" and len(line.get_xdata())]


def test_the_worst_cosine_is_a_summary_per_balancer(runs, tmp_path, kept):
    assert figures.cosine_distribution(runs, tmp_path / "c.png") is not None
    (fig,) = kept
    assert_no_legend_over_data(fig)
    (ax,) = fig.axes
    labels = [t.get_text() for t in ax.get_xticklabels()]
    # one group per balancer, not a trace per run
    assert labels == [BALANCERS[b].label for b in ("weighted_sum", "equal_alpha", "marble")]
    assert not [line for line in ax.lines if len(line.get_xdata()) > 1 and line.get_linestyle() == "-"
                and np.ptp(line.get_xdata()) > 1]  # no line drawn along the steps
    shares = {t.get_text() for t in ax.texts}
    assert "0%" in shares and "50%" in shares  # MARBLE applied never below 0, weighted sum half the steps


def test_anti_aligned_fractions_per_balancer_with_intervals(runs, tmp_path, kept):
    data = build_report(ReportInputs(runs_dir=runs[0].path.parent, out=tmp_path / "report", window=2))
    assert set(data["anti_aligned_weighted_sum_direction_by_balancer"]) == {"weighted_sum", "equal_alpha", "marble"}
    kept.clear()
    assert figures.anti_aligned_intervals(data["anti_aligned_by_balancer"],
                                          data["anti_aligned_weighted_sum_direction_by_balancer"],
                                          data["anti_aligned_published"], tmp_path / "x.png") is not None
    (fig,) = kept
    assert_no_legend_over_data(fig)


def test_the_verdict_figure_draws_each_answer_with_its_interval(runs, tmp_path, kept):
    data = build_report(ReportInputs(runs_dir=runs[0].path.parent, out=tmp_path / "report", window=2))
    kept.clear()
    assert glance.glance_figure(data, tmp_path / "v.png") is not None
    (fig,) = kept
    a, b, c = fig.axes
    assert [t.get_text() for t in a.get_yticklabels()] == ["bright", "sat", "color"]
    assert [t.get_text() for t in b.get_yticklabels()] == ["color"]  # the specialist
    change = data["questions"]["a_every_reward_rises_under_marble"]["change"]["bright"]
    first_row = a.collections[0].get_segments()[0]  # the first error bar: bright's interval
    assert sorted(first_row[:, 0]) == pytest.approx([change["low"], change["high"]])
    words = {t.get_text() for ax in (a, b, c) for t in ax.texts}
    assert words & {"yes", "no"} or any(w.startswith(("undecided", "not answered")) for w in words)
    md = (tmp_path / "report" / "report.md").read_text()
    assert md.split("\n## ")[1].startswith("Verdict") and "(figures/verdict.png)" in md.split("\n## ")[1]
    assert md.split("\n## ")[2].startswith("What was run")


def test_balancer_looks_are_distinct_and_stable():
    colors = [balancer_look(b).color for b in known_balancers()]
    assert len(set(colors)) == len(colors) and "tab:gray" not in colors  # grey: only the unknown
    assert balancer_look("weighted_sum").label == BALANCERS["weighted_sum"].label  # the descriptor's
    assert balancer_look("marble") == balancer_look("marble") and balancer_look("new_method").label == "new method"
    assert seed_styles([2, None, 1, 2]) == {1: "-", 2: "--", None: ":"}
    assert balancer_order(["marble", "zoo_x", "equal_alpha", "marble", "weighted_sum"]) == [
        "weighted_sum", "equal_alpha", "marble", "zoo_x"]


def test_report_summary_prints_the_path_and_the_verdict_in_one_line(runs, tmp_path, capsys):
    out = tmp_path / "report"
    data = build_report(ReportInputs(runs_dir=runs[0].path.parent, out=out, window=2))
    capsys.readouterr()
    assert main(["summary", str(out)]) == 0
    report_line, verdict_line = capsys.readouterr().out.splitlines()
    assert report_line == f"report: {(out / 'report.html').resolve()}"
    assert verdict_line == f"verdict: {glance.summary_line(data)}" and verdict_line.count("(") >= 3
    assert main(["summary", str(tmp_path / "nowhere")]) == 1
    assert "nowhere/verdict.json" in capsys.readouterr().err


def test_make_demo_ends_with_the_summary_and_runs_its_jobs_locally():
    # --no-print-directory: under `make test` this make is a sub-make, which prints "Leaving directory"
    plan = subprocess.run(["make", "--no-print-directory", "-n", "demo", "VENV=/nonexistent-venv"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout.strip().splitlines()
    snakemake = next(line for line in plan if "snakemake -c2 all" in line)
    assert "MARBLE_LOCAL_JOBS=1" in snakemake  # the preflight doctor skips SLURM on a local run
    assert plan[-1] == "/nonexistent-venv/bin/marble report summary results/report"
