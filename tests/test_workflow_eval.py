"""eval_only and evaluation folders: eval_only never plans training, evaluations are
keyed by their image-changing settings, and a rerun resumes a killed evaluation."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml
from test_workflow_lib import copy_workflow, snakemake


def _usable_checkpoint(ckpt: Path) -> None:
    """A checkpoint folder that passes the workflow's check: one file and its marker."""
    from marble.training.checkpoint_format import COMPLETE, marker_text

    ckpt.mkdir(parents=True)
    (ckpt / "state.pt").write_bytes(b"placeholder")
    (ckpt / COMPLETE).write_text(marker_text(ckpt))


def _placeholders(work: Path, runs: dict[str, int]) -> None:
    """Inputs and finished runs as empty files: enough for a dry run. Every file is
    older than the model, so Snakemake's mtime rule alone would retrain every run."""
    old, older = time.time() - 3600, time.time() - 7200
    # the toy rewards' checkpoint folder too: every run and evaluation takes it as an input
    reward_dir = yaml.safe_load((work / "config.yaml").read_text())["reward_ckpt_dir"]
    for d in ["data/models/tiny-sd3", "data/raw-tiny", "data/datasets/tiny", reward_dir]:
        (work / d).mkdir(parents=True, exist_ok=True)
    for f in ["data/datasets/tiny/train.parquet", "data/datasets/tiny/test.parquet"]:
        (work / f).write_bytes(b"placeholder")
    for run, step in runs.items():
        ckpt = work / f"results/runs/{run}/checkpoints/checkpoint-{step:06d}"
        _usable_checkpoint(ckpt)
        (work / f"results/runs/{run}/train_summary.json").write_text("{}")
    for p in (work / "results").rglob("*"):
        os.utime(p, (older, older))
    for p in (work / "data").rglob("*"):
        os.utime(p, (old, old))


def _set(work: Path, **sections) -> None:
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    for section, values in sections.items():
        if isinstance(values, dict) and isinstance(cfg.get(section), dict):
            cfg[section].update(values)
        else:
            cfg[section] = values
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))


def _planned(work: Path, target: str) -> tuple[list[str], list[str]]:
    """(rules, outputs) of the jobs a dry run plans."""
    out = snakemake(["-n", "-c1", target], work).stdout
    rules = [line.strip().split()[1].rstrip(":")
             for line in out.splitlines() if line.strip().startswith(("rule ", "localrule "))
             and line.strip().endswith(":")]
    outputs = [line.split("output:")[1].strip() for line in out.splitlines()
               if line.strip().startswith("output:")]
    return rules, outputs


def test_eval_only_never_plans_training(tmp_path):
    work = copy_workflow(tmp_path / "repo")
    _placeholders(work, {"marble": 4, "weighted_sum": 4})
    rules, outputs = _planned(work, "eval_only")
    assert "train_run" not in rules and "evaluate_ckpt" in rules
    assert any("/marble/checkpoint-000004/" in o for o in outputs)
    # A change of a run's settings: `all` would retrain it, eval_only still does not,
    # and it skips the run whose new final checkpoint does not exist yet.
    _set(work, runs={"marble": {"preset": "tiny", "max_steps": 21},
                     "weighted_sum": {"preset": "tiny_weighted_sum", "max_steps": 4}})
    rules, outputs = _planned(work, "eval_only")
    assert "train_run" not in rules
    assert not any("/marble/" in o for o in outputs)
    assert any("/weighted_sum/checkpoint-000004/" in o for o in outputs)
    assert "train_run" in _planned(work, "all")[0]


def _eval_folder(outputs: list[str]) -> str:
    folders = {o.split("/")[2] for o in outputs if o.startswith("results/eval/") and "average_scores" in o}
    assert len(folders) == 1, outputs
    return folders.pop()


def test_changed_eval_setting_writes_a_new_folder(tmp_path):
    work = copy_workflow(tmp_path / "repo")
    _placeholders(work, {"marble": 4})
    _set(work, runs={"marble": {"preset": "tiny", "max_steps": 4}})
    first = _eval_folder(_planned(work, "eval_only")[1])
    assert first.startswith("n4-r64-")
    _set(work, eval={"limit": 5, "rewards": {"pickscore": ["toy_brightness"],
                                             "geneval": ["toy_brightness"]}})
    assert _eval_folder(_planned(work, "eval_only")[1]) == first  # resumable in place
    for change in [{"num_inference_steps": 6}, {"resolution": 32}, {"guidance_scale": 4.5},
                   {"mixed_precision": "bf16"}]:
        _set(work, eval={"num_inference_steps": 4, "resolution": 64, "guidance_scale": 1.0,
                         "mixed_precision": "no", **change})
        assert _eval_folder(_planned(work, "eval_only")[1]) != first, change
    _set(work, eval={"num_inference_steps": 4, "resolution": 64, "guidance_scale": 1.0,
                     "mixed_precision": "no"}, model_dir="data/models/other")
    (work / "data/models/other").mkdir(parents=True)
    assert _eval_folder(_planned(work, "eval_only")[1]) != first


def test_reward_options_reach_every_evaluation_quoted(tmp_path):
    """eval.reward_options is passed to `marble evaluate` as one shell-quoted JSON argument,
    and, since options change scores, evaluations go to another settings folder."""
    work = copy_workflow(tmp_path / "repo")
    _placeholders(work, {"marble": 4})
    _set(work, runs={"marble": {"preset": "tiny", "max_steps": 4}})
    first = _eval_folder(_planned(work, "eval_only")[1])
    options = {"ocr": {"reference_rules": True}, "unifiedreward": {"url": "http://h/a b"}}
    _set(work, eval={"reward_options": options})
    out = snakemake(["-n", "-p", "-c1", "eval_only"], work).stdout
    flags = [line for line in out.splitlines() if "marble evaluate" in line]
    assert flags and all("--reward_options" in line for line in flags)
    quoted = json.dumps(options, sort_keys=True)
    assert f"--reward_options '{quoted}'" in flags[0]
    assert _eval_folder(_planned(work, "eval_only")[1]) != first


def test_scanned_runs_with_one_name_stay_distinct(tmp_path):
    """Two scan dirs holding a `marble` run: both evaluated; an absolute path to our own
    results/runs is the same checkpoint, not a clash."""
    work = copy_workflow(tmp_path / "repo")
    _placeholders(work, {"marble": 4})
    for site in ["siteA", "siteB"]:
        ckpt = tmp_path / site / "marble/checkpoints/checkpoint-000002"
        _usable_checkpoint(ckpt)
    _set(work, runs={"marble": {"preset": "tiny", "max_steps": 4}},
         eval={"scan_dirs": [str(tmp_path / "siteA"), str(tmp_path / "siteB"),
                             str((work / "results/runs").resolve())]})
    rules, outputs = _planned(work, "eval_only")
    runs = {o.split("/")[3] + "/" + o.split("/")[4] for o in outputs if "average_scores" in o}
    assert runs == {"marble/checkpoint-000002", "marble-siteB/checkpoint-000002",
                    "marble/checkpoint-000004"}, runs
    assert "train_run" not in rules


@pytest.mark.slow
def test_killed_evaluation_resumes(tiny_model_dir, tmp_path):
    """What a killed first evaluation leaves (some rows in evaluation_results.jsonl, no
    average_scores.json, no summary): the rerun generates only the missing samples."""
    import shutil

    from marble.data.tiny_prompts import write_tiny_raw
    from marble.models import load_pipeline
    from marble.models.lora import add_lora_adapters, save_lora_diffusers
    from marble.training.checkpoint import checkpoint_dir, save_checkpoint

    work = copy_workflow(tmp_path / "repo")
    shutil.copytree(tiny_model_dir, work / "data/models/tiny-sd3")
    write_tiny_raw(work / "data/raw-tiny")
    transformer = load_pipeline(str(tiny_model_dir)).transformer
    add_lora_adapters(transformer, rank=2, alpha=2, targets=["to_q"], seed=0)
    save_checkpoint(checkpoint_dir(tmp_path / "ckpts/marble", 3), {"step": 3},
                    write_lora=lambda folder: save_lora_diffusers(transformer, folder))
    _set(work, runs={}, eval={"datasets": ["pickscore"], "limit": 3, "save_images": False,
                              "scan_dirs": [str(tmp_path / "ckpts")]})
    # Only the evaluation's rules (and the preflight gate): without the split tables the
    # workflow would assemble them and pretrain a new tiny model over the copied one.
    only_eval = ["-c1", "eval_only", "--allowed-rules", "preflight", "evaluate_ckpt", "eval_summary",
                 "eval_only"]
    snakemake(only_eval, work)
    [scores] = list((work / "results/eval").glob("*/marble/checkpoint-000003/pickscore/average_scores.json"))
    folder = scores.parent
    rows = (folder / "evaluation_results.jsonl").read_text().splitlines()
    assert len(rows) == 3
    scores.unlink()
    (work / "results/eval/summary.csv").unlink()
    (folder / "evaluation_results.jsonl").write_text(rows[0] + "\n")
    snakemake(only_eval, work)
    timing = json.loads((folder / "run_info.json").read_text())["timing"]
    assert timing["pending"] == 2 and timing["generated"] == 2
    again = (folder / "evaluation_results.jsonl").read_text().splitlines()
    assert again[0] == rows[0] and len(again) == 3
    assert json.loads(scores.read_text())["num_samples"] == 3


def test_paper_eval_config_evaluates_public_checkpoints_without_training(tmp_path):
    work = copy_workflow(tmp_path / "repo", config="config/paper-eval.yaml")
    out = snakemake(["-n", "-p", "-c1", "eval_only"], work).stdout
    rules = {line.strip().split()[1].rstrip(":") for line in out.splitlines()
             if line.strip().startswith("rule ") and line.strip().endswith(":")}
    assert "train_run" not in rules and {"fetch_hub_lora", "paper_comparison", "table1"} <= rules
    evals = [line for line in out.splitlines() if "marble evaluate" in line]
    assert len(evals) == 9 * 4  # Table 1's public rows
    base = [line for line in evals if "/sd35m/base/" in line]
    assert len(base) == 4 and all("--checkpoint_path" not in x and "--lora_hf_path" not in x
                                  for x in base)
    assert any("--lora_hf_path data/loras/flowgrpo_geneval" in x for x in evals)
    # One hub download (marble.assets.hub), pinned: an unpinned revision is refused there.
    assert ("python -m marble.assets.hub hf:jieliu/SD3.5M-FlowGRPO-PickScore@10c56697459bbdbe54d5e375912f49a0bcfae773"
            " --out data/loras/flowgrpo_pickscore --require-commit") in out


def _published_script():
    import importlib.util

    from test_workflow_lib import ROOT

    spec = importlib.util.spec_from_file_location("published", ROOT / "workflow/scripts/published.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ours_beside_published_numbers(tmp_path):
    published = _published_script()
    eval_dir = tmp_path / "eval"
    scores = {"pickscore": {"pickscore": 0.8, "clipscore": 0.25}, "ocr": {"ocr": 0.2}}
    for dataset, values in scores.items():
        folder = eval_dir / "sd35m/base" / dataset
        folder.mkdir(parents=True)
        (folder / "average_scores.json").write_text(json.dumps(values))
    from test_workflow_lib import ROOT

    rows = published.load_published(ROOT / "config/paper_published.yaml")
    records = published.comparison(published.table1.ours_by_run([eval_dir]), rows)
    by = {(r["run"], r["metric"]): r for r in records}
    assert by[("sd35m", "PickScore")]["ours"] == pytest.approx(20.8)  # x26, as the paper
    assert by[("sd35m", "PickScore")]["diff"] == pytest.approx(20.8 - 20.51)
    assert by[("sd35m", "OCR")]["diff"] == pytest.approx(0.2 - 0.12)
    assert by[("sd35m", "GenEval")]["ours"] is None and by[("sd35m", "GenEval")]["diff"] is None
    text = published.render(records, rows["source"])
    assert "| SD3.5-M (w/o CFG) | PickScore | 20.800 | 20.510 | +0.290 |" in text
    assert "Not (fully) evaluated here:" in text and "+ FlowGRPO (OCR)" in text
    # Values come from the one transcription of Table 1 (marble.report.published).
    from marble.report.published import TABLE1, TABLE1_COLUMNS

    trained_here = {name for name in rows["rows"] if name not in TABLE1}
    assert trained_here == {"+ DiffusionNFT (sequential, trained here)"}  # no published numbers
    for name in trained_here:
        assert not rows["rows"][name]["values"]  # its numbers are ours alone
    for name, row in rows["rows"].items():
        if name not in trained_here:
            assert row["values"]["HPSv2.1"] == TABLE1[name][TABLE1_COLUMNS.index("HPSv2.1")]
    bad = tmp_path / "bad.yaml"
    bad.write_text("rows: {x: {run: a, values: {Pickscore: 1}}}\n")
    with pytest.raises(ValueError, match="bad.yaml: row 'x': unknown metric"):
        published.load_published(bad)


def test_a_prompt_file_edited_in_place_reruns_its_evaluation(tmp_path):
    """The evaluation's input was the prompt folder, which an edit in place does not redate:
    `snakemake` said "Nothing to be done" over the old prompts' scores. A digest of each prompt
    file stands in for it (marble.workflow.digests)."""
    work = copy_workflow(tmp_path / "repo")
    prompts = work / "data/raw-tiny/pickscore/test.txt"
    prompts.parent.mkdir(parents=True)
    prompts.write_text("a castle at dawn\na red apple\n")
    _placeholders(work, {"marble": 4})  # every input dated an hour back, the prompts included
    _set(work, runs={"marble": {"preset": "tiny", "max_steps": 4}}, eval={"datasets": ["pickscore"]})
    rules, outputs = _planned(work, "eval_only")
    assert set(rules) == {"evaluate_ckpt", "eval_summary", "eval_only"}, rules  # the digest: written as it read
    files = [f for line in outputs for f in line.split(", ")]
    for n, out in enumerate(files):  # the planned jobs as done, in order: outputs newer than inputs
        (work / out).parent.mkdir(parents=True, exist_ok=True)
        (work / out).write_text("{}")
        os.utime(work / out, (time.time() + n, time.time() + n))
    assert _planned(work, "eval_only")[0] == []
    prompts.write_text("a castle at dawn\na green apple\n")  # in place: the folder keeps its date
    rules, outputs = _planned(work, "eval_only")
    assert "evaluate_ckpt" in rules and any(o.endswith("/pickscore/average_scores.json") for o in outputs)
    digest = work / "results/prompts/pickscore.sha256"
    assert digest.read_text().startswith("sha256:")
    digest.unlink()  # as on a fresh checkout, where the prompts come after the DAG: the rule writes it
    (work / "data/raw-tiny/pickscore").rename(work / "data/raw-tiny/later")
    assert "prompt_digest" in _planned(work, "eval_only")[0]
