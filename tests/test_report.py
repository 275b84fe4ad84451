"""`marble report` on synthetic run folders with known metrics: table values, figures,
self-contained HTML, missing-input sections, the CLI."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

from marble.report.cli import main
from marble.report.tables import eval_table
from marble.workflow import report_captions

REWARDS = ["bright", "sat", "color"]
APPLICABLE = {"bright": 24, "sat": 24, "color": 8}  # color: the specialist (1/3 of rollouts)
UP = [0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45]
DOWN = UP[::-1]
DIAG_STEPS = [2, 4, 6, 8]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(root: Path, name: str, method: str, curves: dict, rho: float = 0.7,
              diag: dict | None = None, alphas: bool = False, seed: int = 42,
              evals: dict | None = None) -> None:
    """A run folder as `marble train` writes it; `evals`: reward -> (step 0, step 8) held-out
    means for an eval.jsonl (steps 0, 4, 8; step 4 halfway)."""
    run = root / name
    run.mkdir(parents=True)
    config = {"preset": name, "balancer": {"method": method, "alpha_ema": rho, "amortize_every": 5},
              "train": {"lr": 0.003, "seed": seed}, "rewards": [{"name": r} for r in REWARDS]}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    if evals:
        (run / "eval.jsonl").write_text("".join(
            json.dumps({"step": step, **{f"eval_reward/{r}": a + share * (b - a) for r, (a, b) in evals.items()}})
            + "\n" for step, share in ((0, 0.0), (4, 0.5), (8, 1.0))))
    lines = []
    for i, step in enumerate(range(1, 9)):
        rec = {"step": step, "epoch": step - 1, "balancer": method, "loss/policy": 0.5,
               "loss/kl": 0.0, "time/step_s": 1.0}
        for r in REWARDS:
            rec[f"reward/{r}"] = curves[r][i]
            rec[f"reward_applicable/{r}"] = APPLICABLE[r]
        if diag and step in DIAG_STEPS:
            j = DIAG_STEPS.index(step)
            rec.update({k: v[j] for k, v in diag.items()})
            if alphas:
                rec.update({"alpha/bright": 0.2, "alpha/sat": 0.3, "alpha/color": 0.5})
                rec.update({"alpha_cache/bright": 0.25, "alpha_cache/sat": 0.3, "alpha_cache/color": 0.45})
        lines.append(json.dumps(rec))
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (run / "train_summary.json").write_text(json.dumps({"final_step": 8}))


WS_DIAG = {"cos_min": [-0.2, 0.1, -0.1, 0.3], "cos_var": [0.1, 0.2, 0.1, 0.2], "anti_aligned": [1, 0, 1, 0],
           "cos_ws_min": [-0.2, 0.1, -0.1, 0.3], "cos_ws_var": [0.1, 0.2, 0.1, 0.2], "anti_aligned_ws": [1, 0, 1, 0]}
MARBLE_DIAG = {"cos_min": [0.3, 0.4, 0.35, 0.45], "cos_var": [0.01, 0.02, 0.01, 0.0], "anti_aligned": [0, 0, 0, 0],
               "cos_ws_min": [-0.3, 0.2, -0.1, -0.05], "cos_ws_var": [0.2, 0.1, 0.3, 0.2],
               "anti_aligned_ws": [1, 0, 1, 1]}
# held-out means at step 0 and 8 (eval.jsonl) of the two runs that evaluated
WS_EVAL = {"bright": (0.2, 0.3), "sat": (0.2, 0.25), "color": (0.5, 0.3)}
MARBLE_EVAL = {"bright": (0.2, 0.35), "sat": (0.2, 0.3), "color": (0.5, 0.9)}
LATEST = {"weighted_sum": (0.5, 0.4, 0.2), "marble": (0.6, 0.5, 0.6), "rho_05": (0.55, 0.45, 0.4)}


def write_eval(root: Path) -> Path:
    rows = []
    for run, values in LATEST.items():
        for ckpt, vals in (("checkpoint-5", (9.0, 9.0, 9.0)), ("checkpoint-10", values)):
            for (dataset, metric), value in zip(
                [("drawbench", "bright"), ("drawbench", "sat"), ("geneval", "color")], vals
            ):
                rows.append({"run": run, "checkpoint": ckpt, "dataset": dataset, "metric": metric, "value": value})
        for dataset in ("drawbench", "geneval"):
            images = root / "eval" / run / "checkpoint-10" / dataset / "images"
            images.mkdir(parents=True)
            with open(images.parent / "evaluation_results.jsonl", "w") as fh:
                for k in range(6):
                    Image.new("RGB", (32, 32), (40 * k, 100, 200)).save(images / f"{k:04d}.png")
                    fh.write(json.dumps({"sample_id": k, "prompt": f"a {dataset} prompt number {k}",
                                         "scores": {"bright": 0.1 * k, "color": None},
                                         "image_path": f"images/{k:04d}.png"}) + "\n")
    summary = root / "eval" / "summary.csv"
    pd.DataFrame(rows).to_csv(summary, index=False)
    return summary


BENCH = {"balancers": {"weighted_sum": {"step_s": 2.0, "peak_mb": 1000.0},
                       "marble": {"step_s": 2.5, "peak_mb": 1100.0},
                       "mgda": {"step_s": 4.0, "peak_mb": 1200.0}},
         "ratios": {"marble": {"time": 1.25, "memory": 1.1}, "mgda": {"time": 2.0, "memory": 1.2}}}


@pytest.fixture(scope="module")
def full_report(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("results")
    runs = root / "runs"
    write_run(runs, "weighted_sum", "weighted_sum", {"bright": UP, "sat": UP, "color": DOWN}, diag=WS_DIAG,
              evals=WS_EVAL)
    write_run(runs, "marble", "marble", {"bright": UP, "sat": UP, "color": UP}, diag=MARBLE_DIAG, alphas=True,
              evals=MARBLE_EVAL)
    write_run(runs, "rho_05", "marble", {"bright": UP, "sat": UP, "color": UP}, rho=0.5)
    write_run(runs, "rho_09", "marble", {"bright": UP, "sat": DOWN, "color": UP}, rho=0.9)
    write_run(runs, "equal_alpha", "equal_alpha", {"bright": UP, "sat": UP, "color": UP})
    summary = write_eval(root)
    (root / "bench.json").write_text(json.dumps(BENCH))
    out = root / "report"
    rc = main(["--runs", str(runs), "--out", str(out), "--eval-summary", str(summary),
               "--bench", str(root / "bench.json"), "--eval-dir", str(root / "eval"), "--window", "2"])
    assert rc == 0
    return out


def test_eval_table_latest_checkpoint_and_composite(full_report):
    table = pd.read_csv(full_report / "tables" / "eval_scores.csv", index_col="run")
    assert list(table.columns) == ["checkpoint", "bright", "color", "sat", "composite"]
    assert set(table["checkpoint"]) == {"checkpoint-10"}  # natural sort: 10 after 5
    assert table.loc["marble", "color"] == pytest.approx(0.6)
    assert table.loc["weighted_sum", "sat"] == pytest.approx(0.4)
    cols = np.array([LATEST[r] for r in table.index])
    z = (cols - cols.mean(axis=0)) / cols.std(axis=0)  # population std
    assert table["composite"].to_numpy() == pytest.approx(z.mean(axis=1))


def test_eval_table_shared_metric_names_and_injected_composite():
    summary = pd.DataFrame({"run": ["a", "a", "b", "b"], "checkpoint": ["c1"] * 4,
                            "dataset": ["ocr", "geneval"] * 2, "metric": ["bright"] * 4,
                            "value": [1.0, 2.0, 3.0, 4.0]})
    table = eval_table(summary, composite=lambda wide: wide.sum(axis=1))
    assert list(table.columns) == ["checkpoint", "geneval/bright", "ocr/bright", "composite"]
    assert table.loc["b", "composite"] == pytest.approx(7.0)


def test_eval_table_leaves_out_count_columns():
    summary = pd.DataFrame({"run": ["a", "a", "a", "a"], "checkpoint": ["c1"] * 4,
                            "dataset": ["ocr"] * 4,
                            "metric": ["ocr", "n_ocr", "nan_ocr", "num_samples"],
                            "value": [0.5, 10.0, 1.0, 11.0]})
    table = eval_table(summary, composite=lambda wide: wide.sum(axis=1))
    assert list(table.columns) == ["checkpoint", "ocr", "composite"]
    assert table.loc["a", "composite"] == pytest.approx(0.5)


def test_harmony_tables_hold_the_right_numbers(full_report):
    by_run = pd.read_csv(full_report / "tables" / "harmony_by_run.csv", index_col="run")
    ws, mb = by_run.loc["weighted_sum"], by_run.loc["marble"]
    assert ws["logged_steps"] == 4 and ws["applied_anti_aligned_frac"] == pytest.approx(0.5)
    assert ws["applied_cos_min_mean"] == pytest.approx(0.025)
    assert ws["applied_cos_var_mean"] == pytest.approx(0.15)
    assert mb["applied_anti_aligned_frac"] == 0.0 and mb["applied_cos_min_mean"] == pytest.approx(0.375)
    assert mb["ws_dir_anti_aligned_frac"] == pytest.approx(0.75)
    assert mb["ws_dir_cos_min_mean"] == pytest.approx(-0.0625)
    assert by_run.loc["equal_alpha", "logged_steps"] == 0
    pooled = pd.read_csv(full_report / "tables" / "harmony_by_balancer.csv", index_col="balancer")
    assert pooled.loc["marble", "applied_anti_aligned_frac"] == 0.0  # rho runs logged no cosines
    assert pooled.loc["weighted_sum", "published_anti_aligned_frac"] == pytest.approx(0.8)


def test_cost_table_relative_speed_is_inverse_time_ratio(full_report):
    cost = pd.read_csv(full_report / "tables" / "cost.csv", index_col="balancer")
    assert cost.loc["marble", "relative_speed"] == pytest.approx(0.8)
    assert cost.loc["mgda", "relative_speed"] == pytest.approx(0.5)
    # a bench without a CUDA device measured the CPU's RSS: its columns say so (issue 41)
    assert cost.loc["marble", "cpu_rss_ratio"] == pytest.approx(1.1)
    assert cost.loc["marble", "peak_cpu_rss_mb"] == pytest.approx(1100)
    assert not any(c in cost.columns for c in ("memory_ratio", "peak_mb", "peak_gpu_memory_mb"))
    assert cost.loc["weighted_sum", "relative_speed"] == pytest.approx(1.0)
    assert cost.loc["marble", "published_relative_speed"] == pytest.approx(0.97)
    assert cost.loc["mgda", "published_gpu_memory_ratio"] == pytest.approx(1.14)


def test_rho_ablation_groups_runs_differing_only_in_alpha_ema(full_report):
    rho = pd.read_csv(full_report / "tables" / "rho_ablation_0.csv")
    assert list(rho["rho"]) == [0.5, 0.7, 0.9]
    assert list(rho["run"]) == ["rho_05", "marble", "rho_09"]
    assert rho.loc[0, "color"] == pytest.approx(0.4)  # evaluated: eval scores
    assert rho.loc[2, "train/sat"] == pytest.approx(np.mean(DOWN[-2:]))  # not evaluated
    assert not (full_report / "tables" / "rho_ablation_1.csv").exists()


def test_verdict_and_training_changes(full_report):
    """The verdict is the claim's statistics over seeds: every run here has seed 42, so each
    balancer is one sample (MARBLE's three runs averaged) and no question has an interval;
    the weighted sum evaluated (held-out change), two of MARBLE's runs did not (training)."""
    verdict = json.loads((full_report / "verdict.json").read_text())
    assert verdict["specialists"] == {"color": pytest.approx(1 / 3)}
    changes = pd.read_csv(full_report / "tables" / "training_reward_change.csv")
    row = changes[(changes.run == "weighted_sum") & (changes.reward == "color")].iloc[0]
    assert row["change"] == pytest.approx(np.mean(DOWN[-2:]) - np.mean(DOWN[:2]))
    assert not row["improved"]
    by_bal = verdict["reward_change_by_balancer"]
    assert by_bal["weighted_sum"]["measure"] == "held-out"
    assert by_bal["weighted_sum"]["change"]["color"]["mean"] == pytest.approx(0.3 - 0.5)
    assert by_bal["marble"]["measure"] == "training" and by_bal["marble"]["seeds"] == [42]
    # marble, rho_05 (color UP) and rho_09 (color UP) share seed 42: one sample, their mean
    assert by_bal["marble"]["change"]["color"] == {"mean": pytest.approx(0.3), "low": None,
                                                   "high": None, "n": 1, "sd": None}
    assert verdict["heldout_change"]["marble"]["color"] == pytest.approx(0.4)
    assert set(verdict["heldout_change"]) == {"marble", "weighted_sum"}
    md = (full_report / "report.md").read_text()
    for sentence in verdict["sentences"]:
        assert sentence in md
    b = verdict["sentences"][1]
    assert b.startswith("(b) Every specialist rises more under MARBLE than under the weighted sum "
                        "(paired by seed): no difference larger than inf.")
    assert "training-reward change (last logged epochs minus the first; no eval.jsonl in rho_05, rho_09)" in b
    assert "paired over the seeds both balancers ran (42)" in b and "observed difference: n/a" in b
    table = pd.read_csv(full_report / "tables" / "reward_change_by_balancer.csv")
    assert set(table["measure"]) == {"held-out", "training"}


def test_verdict_json_shape(full_report):
    """The claim's keys CI checks: the answers, anti-aligned fractions, [mean, stderr] per reward."""
    verdict = json.loads((full_report / "verdict.json").read_text())
    for key in ("specialists_rise_more_under_marble", "every_reward_rises_under_marble",
                "marble_less_anti_aligned"):
        assert verdict[key] in (True, False) or verdict[key].startswith("no difference larger than ")
    assert "inconclusive" not in json.dumps(verdict)
    assert verdict["anti_aligned"]["weighted_sum"] == pytest.approx(0.5)
    assert verdict["anti_aligned"]["marble"] == pytest.approx(0.0)
    assert verdict["anti_aligned"]["equal_alpha"] is None  # logged no diagnostics
    assert verdict["anti_aligned_weighted_sum_direction"]["marble"] == pytest.approx(0.75)
    assert verdict["anti_aligned_by_balancer"]["weighted_sum"]["mean"] == pytest.approx(0.5)
    assert verdict["anti_aligned_published"] == {"weighted_sum": 0.8, "marble": 0.0}
    assert verdict["anti_aligned_by_step_kind"] == {}  # the synthetic runs log no full_solve
    runs = {"weighted_sum", "marble", "rho_05", "rho_09", "equal_alpha"}
    assert set(verdict["reward_change"]) == runs == set(verdict["anti_aligned"])
    for per_reward in verdict["reward_change"].values():
        assert set(per_reward) == set(REWARDS)
        for pair in per_reward.values():
            assert len(pair) == 2 and all(x is None or isinstance(x, float) for x in pair)
    mean, se = verdict["reward_change"]["weighted_sum"]["color"]
    assert mean == pytest.approx(np.mean(DOWN[-2:]) - np.mean(DOWN[:2]))
    assert set(verdict["questions"]) == {"a_every_reward_rises_under_marble",
                                         "b_specialists_rise_more_under_marble", "c_marble_less_anti_aligned"}
    assert verdict["level"] == 0.95 and verdict["power"] == 0.8


def test_table1_beside_the_published_numbers(full_report):
    """The lead's Table 1 is THE builder's (marble.report.table1.build) per balancer."""
    side = pd.read_csv(full_report / "tables" / "paper_table_1.csv")
    cell = side.set_index(["row", "metric"])
    # This summary has no `n_<reward>` counts (marble evaluate writes them): no reward means, so
    # ours is "not measured", said, never a value from a second definition of the mean; the
    # values path is test_paper_tables.test_table1_view_toy_rewards_averaged_over_datasets.
    assert set(side["basis"]) == {"not measured: no evaluated weighted_sum run",
                                  "not measured: no evaluated marble run"}
    assert cell.loc[("marble (+ MARBLE)", "HPSv2.1"), "published"] == pytest.approx(0.355)
    assert cell.loc[("weighted_sum (+ DiffusionNFT (weighted-sum))", "OCR"), "published"] == pytest.approx(0.91)
    assert "Composite" not in set(side["metric"])  # over two rows it would only rank them
    md = (full_report / "report.md").read_text()
    assert "## Details: Table 1 per balancer, and as published" in md and "MARBLE project page" in md
    assert not (full_report / "tables" / "table1_beside_paper.csv").exists()  # one view, not two
    published = pd.read_csv(full_report / "tables" / "table1_published.csv", index_col=0)
    assert len(published) == 11 and published.loc["+ MARBLE", "HPSv2.1"] == pytest.approx(0.355)


# No paper_table_1 / paper_rho_ablation bars: these runs measure none of the paper's metrics,
# and a bar chart of published values alone is not drawn (issue 26: ours beside published or
# the two sides as separate tables).
FIGURES = ["verdict", "training_rewards", "alpha", "worst_cosine", "anti_aligned", "samples_marble",
           "samples_weighted_sum", "samples_rho_05", "paper_gradient_harmony", "paper_training_cost"]


def test_figures_are_valid_pngs(full_report):
    for name in FIGURES:
        path = full_report / "figures" / f"{name}.png"
        assert path.read_bytes()[:8] == PNG_MAGIC, name
        with Image.open(path) as img:
            img.verify()
        with Image.open(path) as img:
            assert img.width > 300 and img.height > 200, name
    # runs without eval images get a missing note instead of a grid
    assert not (full_report / "figures" / "samples_equal_alpha.png").exists()
    assert "Missing: no eval images for `equal_alpha`" in (full_report / "report.md").read_text()


def test_html_is_self_contained_with_images_and_tables(full_report):
    html = (full_report / "report.html").read_text()
    assert html.count("<img src='data:image/png;base64,") == len(FIGURES)
    assert "src='figures/" not in html and "http" not in html
    assert "<td>checkpoint-10</td>" in html and "<td>0.8</td>" in html  # eval + cost tables
    md = (full_report / "report.md").read_text()
    for name in FIGURES:
        assert f"(figures/{name}.png)" in md
    assert "| marble | 2.5 | 1100 | 0.8 | 1.1 | 0.97 | 1.14 |" in md


def test_python_m_entry_point(full_report, tmp_path):
    runs = full_report.parent / "runs"
    out = tmp_path / "r"
    proc = subprocess.run([sys.executable, "-m", "marble.report", "--runs", str(runs), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert ("verdict: (a) every reward rises under MARBLE: not answered (too few runs or seeds); (b) every "
            "specialist rises more") in proc.stdout
    assert (out / "report.html").is_file()


def test_every_figure_and_table_has_a_caption(full_report):
    """A figure or table added to the report without workflow/report/<folder>/<kind>.rst
    would reach `snakemake --report` uncaptioned."""
    assert report_captions.uncaptioned(full_report, Path(__file__).resolve().parents[1]) == []
    assert any(p.name.startswith("samples_") for p in (full_report / "figures").iterdir())


# One file's entry in the data of Snakemake's report.html.
_SNAKEMAKE_ENTRY = re.compile(r'"results/report/(figures|tables)/([^"]+)": \{"name": "[^"]*", '
                              r'"filename": "[^"]*", "labels": [^,]*, "size": "[^"]*", '
                              r'"caption": "((?:[^"\\]|\\.)*)"')


def _plain(text: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", text)).replace("``", "").split())


def test_snakemake_report_has_every_figure_and_table_with_its_caption(full_report, tmp_path):
    """`snakemake --report` on a finished report: make_report is only touched (the report
    was built by the fixture), so this costs two Snakefile parses and no rendering."""
    from test_workflow_lib import copy_workflow, snakemake

    work = copy_workflow(tmp_path / "repo")
    results, built = work / "results", full_report.parent
    shutil.copytree(built / "runs", results / "runs")
    shutil.copytree(built / "report", results / "report")
    (results / "eval").mkdir()
    shutil.copy2(built / "eval" / "summary.csv", results / "eval" / "summary.csv")
    (results / "bench").mkdir()
    shutil.copy2(built / "bench.json", results / "bench" / "step.json")
    target = "results/report/report.md"
    snakemake(["-c1", target, "--touch", "--allowed-rules", "make_report"], work)
    snakemake([target, "--report", "report.zip", "--allowed-rules", "make_report"], work)
    with zipfile.ZipFile(work / "report.zip") as bundle:
        page = bundle.read("report/report.html").decode("utf-8")
        bundled = {Path(name).name for name in bundle.namelist()}
    registered = {(folder, name): _plain(json.loads(f'"{caption}"'))
                  for folder, name, caption in _SNAKEMAKE_ENTRY.findall(page)}
    known = report_captions.captions(work)
    written = [(folder, p.name) for folder, suffix in report_captions.FOLDERS.items()
               for p in sorted((full_report / folder).glob(f"*{suffix}"))]
    assert len(written) >= 20, written
    for folder, name in written:
        kind = report_captions.caption_kind(Path(name).stem, known[folder])
        assert kind is not None, f"{folder}/{name}: no caption .rst under workflow/report/{folder}"
        assert name in bundled and registered.get((folder, name)) == _plain(known[folder][kind]), \
            (folder, name, registered.get((folder, name)))
