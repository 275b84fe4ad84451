"""Table 1: the 11 rows of config/paper.yaml (and config/table1.yaml, Table 1 only), each
under its own protocol, in one table."""

from __future__ import annotations

import json
import math
import re

import pytest
import yaml
from test_workflow_lib import ROOT, copy_workflow, snakemake

from marble.report import table1
from marble.report.published import TABLE1, TABLE1_COLUMNS, load_published
from marble.workflow import evaluation
from marble.workflow import configs

CONFIG = configs.load(["config/table1.yaml"], ROOT)
PAPER = configs.load(["config/paper.yaml"], ROOT)
PUBLISHED = ROOT / "config/paper_published.yaml"


def test_every_published_row_names_a_configured_row():
    rows = load_published(PUBLISHED)["rows"]
    # all 11, and "sequential" twice: the public LoRA and the schedule trained here
    assert set(rows) == set(TABLE1) | {"+ DiffusionNFT (sequential, trained here)"}
    known = set(CONFIG["runs"]) | set(CONFIG["eval"]["checkpoints"])
    assert {r["run"] for r in rows.values()} == known
    # The paper config holds every row too: its runs include Table 1's two trained ones.
    assert known <= set(PAPER["runs"]) | set(PAPER["eval"]["checkpoints"])


def test_the_paper_configs_are_overlays_on_the_one_eval_section(tmp_path):
    """config/eval.yaml holds Table 1's rows and protocols once; the three paper configs name it
    (`overlay_on:`) and hold no eval section of their own, so one file alone is complete and a
    later file overrides a key or drops a row; a missing base is one clear line."""
    base = yaml.safe_load((ROOT / "config/eval.yaml").read_text())
    for name in ("config/paper.yaml", "config/table1.yaml", "config/paper-eval.yaml"):
        raw = yaml.safe_load((ROOT / name).read_text())
        assert raw[configs.OVERLAY_KEY] == "config/eval.yaml" and "eval" not in raw, name
        composed = configs.load([name], ROOT)
        assert composed["eval"] == base["eval"] and configs.OVERLAY_KEY not in composed, name
        # The base passed explicitly as well (Snakemake's several --configfile) changes nothing.
        assert configs.load(["config/eval.yaml", name], ROOT) == composed
    assert configs.load(["config/paper-eval.yaml"], ROOT)["runs"] == {}
    assert CONFIG["runs"] == {name: PAPER["runs"][name] for name in ("weighted_sum", "rho_07", "sequential")}
    site = tmp_path / "site.yaml"
    site.write_text("eval: {limit: 3, checkpoints: {sdxl: null}}\n")
    mixed = configs.load(["config/table1.yaml", str(site)], ROOT)
    assert mixed["eval"]["limit"] == 3 and mixed["eval"]["checkpoints"]["sdxl"] is None
    assert mixed["eval"]["protocols"] == base["eval"]["protocols"]
    lost = tmp_path / "lost.yaml"
    lost.write_text("mode: paper\noverlay_on: config/nowhere.yaml\n")
    with pytest.raises(SystemExit, match="config/nowhere.yaml does not exist"):
        configs.load([str(lost)], ROOT)


def test_every_workflow_config_has_the_params_dvc_reads():
    """`cp config/X.yaml config.yaml && dvc repro` needs every params key dvc.yaml lists."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    keys = {k for s in stages.values() for p in s.get("params", []) for k in p.get("config.yaml", [])}
    for path in [*sorted((ROOT / "config").glob("*.yaml")), ROOT / ".test/config.yaml"]:
        cfg = configs.load([path], ROOT)
        if "mode" in cfg:  # a workflow config (not a published-rows file)
            assert keys <= set(cfg), f"{path.name}: missing {sorted(keys - set(cfg))}"


def test_row_protocols_of_the_table1_config():
    ev = CONFIG["eval"]
    flow = evaluation.row_protocol(ev, "flowgrpo_geneval")
    assert flow["guidance_scale"] == 4.5 and flow["num_inference_steps"] == 40
    assert evaluation.row_protocol(ev, "sd35m")["guidance_scale"] == 1.0
    assert evaluation.row_protocol(ev, "sdxl")["model_type"] == "generic"
    keys = [(r, "x") for r in [*CONFIG["runs"], *ev["checkpoints"]]]
    targets = evaluation.eval_targets(ev, keys, CONFIG["model_dir"])
    assert len(targets) == 12 * 4
    # sd35m, weighted_sum, rho_07, sequential and the multi-reward LoRA share the default folder; the
    # four CFG 4.5 rows share one; each base model has its own.
    assert len(evaluation.eval_dirs(targets)) == 5


@pytest.fixture(scope="module")
def workflow_copy(tmp_path_factory):
    return copy_workflow(tmp_path_factory.mktemp("table1") / "repo", config="config/table1.yaml")


def _dry_run(work, target, configfile):
    out = snakemake(["-n", "-p", "-c1", target, "--configfile", configfile], work).stdout
    counts = {rule: int(n) for rule, n in re.findall(r"^(\w+)\s+(\d+)$", out, flags=re.MULTILINE)}
    return out, counts


# config/table1.yaml: 12 rows x 4 datasets = 48 evaluations, 3 trainings. config/paper.yaml:
# the same 9 public rows plus 8 runs (the 3 of Table 1, the rho ablation's 4 others,
# equal_alpha) = 17 rows x 4 = 68 evaluations, 8 trainings; the public rows train nothing.
@pytest.mark.parametrize("configfile, evaluations, trainings", [
    ("config/table1.yaml", 48, ["rho_07", "sequential", "weighted_sum"]),
    ("config/paper.yaml", 68, ["equal_alpha", "rho_01", "rho_03", "rho_05", "rho_07", "rho_09",
                               "sequential", "weighted_sum"]),
])
def test_dry_run_plans_the_eleven_rows_and_trains_only_runs(workflow_copy, configfile, evaluations, trainings):
    config = configs.load([configfile], ROOT)
    out, counts = _dry_run(workflow_copy, "all", configfile)
    assert counts["evaluate_ckpt"] == evaluations and counts["train_run"] == len(trainings)
    assert counts["fetch_hub_lora"] == 4 and counts["fetch_hub_model"] == 4  # 3 bases + judge
    assert counts["table1"] == 1
    evals = [line for line in out.splitlines() if "marble evaluate" in line]
    by_row = {}
    for line in evals:
        row = re.search(r"--output_dir results/eval/[^/]+/([^/]+)/", line).group(1)
        by_row.setdefault(row, []).append(line)
    assert sorted(by_row) == sorted([*config["runs"], *config["eval"]["checkpoints"]])
    assert all(len(v) == 4 for v in by_row.values())
    assert all("--guidance_scale 4.5" in x for x in by_row["flowgrpo_ocr"] + by_row["sd35m_cfg"])
    assert all("--guidance_scale 1.0" in x for x in by_row["rho_07"] + by_row["sd35m"])
    assert all("--model_type generic" in x and "--resolution 1024" in x for x in by_row["flux_dev"])
    judged = [x for x in evals if "marble.rewards.service" in x]
    assert len(judged) == evaluations // 4 and all("--dataset drawbench" in x for x in judged)
    trains = re.findall(r"--preset (\S+) --output-dir results/runs/(\S+) ", out)
    assert sorted(trains) == [(name, name) for name in trainings]  # each run is its preset


def test_rho_ablation_dry_run_plans_the_five_rho_runs(workflow_copy):
    """The rho ablation target of the paper config (paper-mini trains only its rho_07 row:
    the other four differ by balancer.alpha_ema alone, unit-tested in test_rho_tiny.py)."""
    out, counts = _dry_run(workflow_copy, "rho_ablation", "config/paper.yaml")
    rho = ["rho_01", "rho_03", "rho_05", "rho_07", "rho_09"]
    assert sorted(re.findall(r"--preset (\S+) --output-dir results/runs/\S+ ", out)) == rho
    assert counts["train_run"] == 5 and counts["evaluate_ckpt"] == 5 * 4 and counts["rho_ablation"] == 1
    assert "fetch_hub_lora" not in counts  # no public row in this table


def _scores(folder, values):
    folder.mkdir(parents=True)
    n = {f"n_{k}": 4 for k in values}
    (folder / "average_scores.json").write_text(json.dumps({**values, **n}))


def test_table1_puts_rows_from_several_settings_folders_beside_the_paper(tmp_path):
    rows = load_published(PUBLISHED)
    eval_root = tmp_path / "eval"
    _scores(eval_root / "n40-a/sd35m/base/ocr", {"ocr": 0.1})
    _scores(eval_root / "n40-a/sd35m/base/pickscore", {"pickscore": 0.8})
    _scores(eval_root / "n40-b/flowgrpo_ocr/hub-x/ocr", {"ocr": 0.9})
    _scores(eval_root / "n40-b/flowgrpo_ocr/hub-x/pickscore", {"pickscore": 0.85})
    from marble.rewards.ocr import ENGINE_LABELS

    onnx = {"scorers": {"ocr": {"engine": f"rapidocr_onnxruntime: {ENGINE_LABELS['rapidocr_onnxruntime']}"}}}
    (eval_root / "n40-b/flowgrpo_ocr/hub-x/ocr/run_info.json").write_text(json.dumps(onnx))
    assert table1.main(["--eval-dir", str(eval_root / "n40-a"), "--eval-dir", str(eval_root / "n40-b"),
                        "--published", str(PUBLISHED), "--out-dir", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out/table1.md").read_text()
    assert "| SD3.5-M (w/o CFG) | sd35m | – / 0.24 | 0.10 / 0.12 | 20.80 / 20.51 |" in text
    assert "Not evaluated yet:" in text and "+ MARBLE" in text
    flow = next(line for line in text.splitlines() if line.startswith("| + FlowGRPO (OCR)"))
    assert "ocr: rapidocr_onnxruntime: ONNX" in flow  # a stand-in engine is named beside the row
    metrics = json.loads((tmp_path / "out/table1.json").read_text())
    assert metrics["+ FlowGRPO (OCR)"]["OCR"] == pytest.approx(0.9)
    assert metrics["+ FlowGRPO (OCR)"]["Composite"] > metrics["SD3.5-M (w/o CFG)"]["Composite"]
    frame = table1.build({}, rows)
    # Over the 11 rows the recomputed published composite is the page's (to its 2 decimals).
    page = {name: TABLE1[name][TABLE1_COLUMNS.index("Composite")] for name in TABLE1}
    for name, value in frame[("published", "Composite")].items():
        if name not in page:  # our trained sequential row: no published numbers of its own
            assert math.isnan(value), name
            continue
        assert value == pytest.approx(page[name], abs=0.006), name


def test_report_shows_every_table1_row_from_the_table1_csv(tmp_path):
    """The report's lead section shows the merged Table 1 (the table1 rule's csv, written from
    every settings folder): a public row evaluated outside the default folder appears too."""
    from marble.report.cli import main as report_main

    eval_root = tmp_path / "eval"
    _scores(eval_root / "n4-default/rho_07/checkpoint-000002/ocr", {"ocr": 0.3})
    _scores(eval_root / "n4-generic/sdxl/base/ocr", {"ocr": 0.7})
    assert table1.main(["--eval-dir", str(eval_root / "n4-default"), "--eval-dir", str(eval_root / "n4-generic"),
                        "--published", str(PUBLISHED), "--out-dir", str(tmp_path / "t1")]) == 0
    (tmp_path / "runs").mkdir()
    assert report_main(["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "report"),
                        "--table1", str(tmp_path / "t1/table1.csv")]) == 0
    text = (tmp_path / "report/report.md").read_text()
    block = text.split("Table 1, every row", 1)[1].split("\n\n")[1]  # the table after the caption
    rows = {line.split("|")[1].strip(): line for line in block.splitlines() if line.startswith("| ")}
    assert len(rows) == 1 + 12  # the header and every published row (sequential twice)
    assert "| 0.70 / 0.14 |" in rows["SD-XL"] and "| 0.30 / 0.96 |" in rows["+ MARBLE"]  # OCR
    assert rows["FLUX.1-Dev"].count("– /") >= 5  # configured, not evaluated


def test_table1_merge_guards_refuse_two_protocols_or_two_checkpoints_for_a_row(tmp_path):
    """A row evaluated in two settings folders (two protocols) or a run with several evaluated
    checkpoints has no single Table 1 value: the builder's input says so, never picks one."""
    root = tmp_path / "eval"
    _scores(root / "n40-a/sd35m/base/ocr", {"ocr": 0.1})
    _scores(root / "n40-b/sd35m/base/ocr", {"ocr": 0.3})
    with pytest.raises(ValueError, match="sd35m/base is evaluated in both .*n40-a and .*n40-b"):
        table1.ours_by_run([root / "n40-a", root / "n40-b"])
    # the table1 rule's command says so in one line (it was a ValueError traceback)
    with pytest.raises(SystemExit, match=r"^python -m marble\.report\.table1: error: sd35m/base is evaluated"):
        table1.main(["--eval-dir", str(root / "n40-a"), "--eval-dir", str(root / "n40-b"),
                     "--published", str(PUBLISHED), "--out-dir", str(tmp_path / "t1")])
    assert not (tmp_path / "t1").exists()  # nothing half written
    from test_workflow_eval import _published_script

    with pytest.raises(SystemExit, match=r"^published\.py: error: sd35m/base is evaluated"):
        _published_script().main(["--eval-dir", str(root / "n40-a"), "--eval-dir", str(root / "n40-b"),
                                  "--published", str(PUBLISHED), "--out", str(tmp_path / "cmp.md")])
    _scores(root / "n40-c/rho_07/step_2/ocr", {"ocr": 0.5})
    _scores(root / "n40-c/rho_07/step_4/ocr", {"ocr": 0.7})
    with pytest.raises(ValueError, match=r"run rho_07 has several evaluated checkpoints \(step_2, step_4\)"):
        table1.ours_by_run([root / "n40-c"])
    # One checkpoint, one folder: its value, and a toy reward as its one mean over datasets.
    _scores(root / "n40-d/rho_07/step_4/ocr", {"ocr": 0.7, "toy": 0.2})
    _scores(root / "n40-d/rho_07/step_4/pickscore", {"toy": 0.4})
    ours = table1.ours_by_run([root / "n40-d"])
    assert ours == {"rho_07": {"OCR": 0.7, "toy (mean over datasets)": pytest.approx(0.3)}}


def test_the_workflow_comparison_page_is_the_builders_table(tmp_path):
    """workflow/scripts/published.py lists THE builder's frame: same ours, same rows."""
    from test_workflow_eval import _published_script

    rows = load_published(PUBLISHED)
    ours = {"sd35m": {"OCR": 0.2, "PickScore": 20.8}}
    frame = table1.build(ours, rows)
    records = _published_script().comparison(ours, rows)
    assert {(r["row"], r["metric"]): r["ours"] for r in records if r["ours"] is not None} == {
        ("SD3.5-M (w/o CFG)", "OCR"): 0.2, ("SD3.5-M (w/o CFG)", "PickScore"): 20.8}
    assert len(records) == frame[[("published", c) for c, *_ in table1.PAPER_METRICS]].notna().sum().sum()


def test_table1_names_its_geneval_aggregate_and_prompt_set_and_keeps_the_others(tmp_path):
    """eval.table1_geneval / eval.table1_prompts select what stands beside the paper; the
    header names it, and the other aggregates and prompt set stay in table1.csv/json."""
    from marble.evaluation.results import geneval_summary

    root = tmp_path / "eval/n40-a/sd35m/base"
    _scores(root / "geneval", {"geneval": 0.34})
    (root / "geneval/average_scores.json").write_text(json.dumps(
        {"geneval": 0.34, "n_geneval": 4, "accuracy": 0.256, "geneval_overall": 0.264}))
    _scores(root / "pickscore", {"pickscore": 0.8})
    _scores(root / "drawbench", {"pickscore": 0.9})
    out = tmp_path / "out"
    assert table1.main(["--eval-dir", str(tmp_path / "eval/n40-a"), "--published", str(PUBLISHED),
                        "--out-dir", str(out), "--geneval", "image_accuracy", "--prompts", "drawbench"]) == 0
    text = (out / "table1.md").read_text()
    assert "| GenEval (image accuracy) |" in text and "| PickScore (drawbench prompts) |" in text
    assert "| SD3.5-M (w/o CFG) | sd35m | 0.26 / 0.24 |" in text  # 0.256, the per-image accuracy
    ours = json.loads((out / "table1.json").read_text())["SD3.5-M (w/o CFG)"]
    assert ours["PickScore"] == pytest.approx(0.9 * 26) and ours["GenEval"] == pytest.approx(0.256)
    assert ours["alt: GenEval (task mean)"] == pytest.approx(0.264)
    assert ours["alt: GenEval (partial credit)"] == pytest.approx(0.34)
    assert ours["alt: PickScore (pickscore prompts)"] == pytest.approx(0.8 * 26)
    shown = table1.report_frame(out / "table1.csv")  # the report's HTML Table 1
    assert "GenEval (image accuracy)" in shown.columns and not any(c.startswith("alt:") for c in shown.columns)
    # Per tag, the partial-credit mean beside the accuracies (the reference's per-tag means).
    rows = [{"scores": {"geneval": s, "accuracy": a}, "metadata": {"tag": tag}}
            for s, a, tag in [(0.5, 0.0, "counting"), (1.0, 1.0, "counting"), (0.2, 0.0, "colors")]]
    summary = geneval_summary(rows)
    assert summary["counting_partial_credit"] == pytest.approx(0.75) and summary["colors_partial_credit"] == 0.2
