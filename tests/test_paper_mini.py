"""The paper-mini configuration and the `make test-paper` runner's failure report (no run here)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from marble.config import load_config
from beds.paper_mini import failed_stages
from marble.workflow import configs

ROOT = Path(__file__).resolve().parents[1]
PAPER_MINI = ("config/paper.yaml", ".test/paper-mini.yaml")
# train.allow_geometry_change acknowledges the shrunk batch geometry (marble.training.geometry).
SIZE_KEYS = ("sampling.", "train.batch_size", "train.save_every", "train.allow_geometry_change",
             "train.eval_max_prompts",
             "model.lora_rank", "model.lora_alpha", "rewards=")


def test_paper_mini_shrinks_sizes_only():
    paper = configs.load(["config/paper.yaml"], ROOT)
    mini = yaml.safe_load((ROOT / ".test/paper-mini.yaml").read_text())
    assert set(mini["runs"]) == set(paper["runs"])
    # the paper path evaluates with the reference's numerics, and paper-mini keeps them
    assert paper["eval"]["numerics"] == "reference" and "numerics" not in (mini.get("eval") or {})
    # Only the rho ablation's other four trainings and the staged run are dropped (proven by
    # dry runs instead; the stage switch by the tiny curriculum's resume test).
    assert sorted(n for n, run in mini["runs"].items() if run is None) == [
        "rho_01", "rho_03", "rho_05", "rho_09", "sequential"]
    for name, run in mini["runs"].items():
        if run is None:
            continue
        assert run["preset"] == paper["runs"][name]["preset"]
        assert all(s.startswith(SIZE_KEYS) for s in run["set"]), run["set"]
        full, small = load_config(run["preset"]), load_config(run["preset"], overrides=run["set"])
        # the paper's code paths stay: balancer, precision, rewards (by name), solver, embed cache
        assert small.balancer == full.balancer and small.model.mixed_precision == full.model.mixed_precision == "fp16"
        assert small.reward_names == full.reward_names and small.sampling.solver == full.sampling.solver
        assert small.sampling.resolution < full.sampling.resolution and small.train.max_steps == full.train.max_steps
    # paper mode and the embedding cache unchanged; only where the text encoders run (no GPU)
    assert "mode" not in mini
    assert set(mini.get("dataset", {})) <= {"embed_device", "embed_dtype", "embed_resources"}
    assert mini["eval"].get("datasets", paper["eval"]["datasets"]) == ["geneval", "ocr", "pickscore", "drawbench"]


def test_paper_mini_evaluates_one_row_of_each_pipeline_kind_shrunk():
    """Every public Table 1 row whose commit is pinned is evaluated (one dataset, 64 px, 4
    steps, the paper's guidance/precision/model); only rows without a commit are dropped."""
    from marble.workflow import evaluation

    paper = configs.load(["config/paper.yaml"], ROOT)
    merged = _merge(paper, yaml.safe_load((ROOT / ".test/paper-mini.yaml").read_text()))
    rows = merged["eval"]["checkpoints"]
    unpinned = sorted(n for n, s in paper["eval"]["checkpoints"].items() if s.endswith("@PIN-A-COMMIT"))
    # diffusionnft_multireward is pinned, but its path (SD3 + hub LoRA) is flowgrpo_pickscore's.
    assert sorted(n for n, s in rows.items() if s is None) == sorted([*unpinned, "diffusionnft_multireward"])
    kept = [n for n, s in rows.items() if s is not None]
    assert sorted(kept) == ["flowgrpo_pickscore", "flux_dev", "sd35l", "sd35m", "sd35m_cfg", "sdxl"]
    covered = set()
    for name in kept:
        row, full = evaluation.row_protocol(merged["eval"], name), evaluation.row_protocol(paper["eval"], name)
        assert (row["resolution"], row["num_inference_steps"], len(row["datasets"])) == (64, 4, 1), name
        assert {k: row[k] for k in ("guidance_scale", "mixed_precision", "model", "model_type")} == \
            {k: full[k] for k in ("guidance_scale", "mixed_precision", "model", "model_type")}, name
        covered |= set(row["datasets"])
    assert covered == {"geneval", "ocr", "pickscore", "drawbench"}
    kinds = {(evaluation.row_protocol(merged["eval"], n)["model_type"], rows[n].startswith("hf:"),
              evaluation.row_protocol(merged["eval"], n)["guidance_scale"] > 1) for n in kept}
    # SD3 base without and with CFG, SD3 + hub LoRA, generic pipelines
    assert {("sd3", False, False), ("sd3", False, True), ("sd3", True, True), ("generic", False, True)} <= kinds


def _merge(base: dict, over: dict) -> dict:
    """Snakemake's merge of two --configfile: mappings recursively, anything else replaced."""
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def test_paper_mini_merged_config_passes_the_schema():
    from snakemake.utils import validate

    merged = _merge(configs.load(["config/paper.yaml"], ROOT),
                    yaml.safe_load((ROOT / ".test/paper-mini.yaml").read_text()))
    validate(merged, str(ROOT / "workflow/schemas/config.schema.yaml"))
    assert merged["mode"] == "paper" and merged["dataset"]["embed"] is True
    assert merged["eval"]["mixed_precision"] == "fp16" and merged["eval"]["limit"] == 2


def test_failed_stages_name_the_rule_and_its_log():
    output = ("Building DAG of jobs...\n"
              "Error in rule train_run:\n    message: None\n    jobid: 7\n"
              "    input: data/models/sd35m\n    log: logs/train/rho_07.log (check log file(s) for error details)\n"
              "    shell:\n        bash ...\n"
              "Error in rule evaluate_checkpoint:\n    jobid: 9\n    shell: marble evaluate\n"
              "Shutting down, this might take some time.\n")
    assert failed_stages(output) == [("train_run", "logs/train/rho_07.log"), ("evaluate_checkpoint", None)]


def test_stage_times_read_snakemake_benchmarks(tmp_path):
    from beds.paper_mini import stage_times

    (tmp_path / "train").mkdir()
    header = "s\th:m:s\tmax_rss\n"
    (tmp_path / "train/rho_07.tsv").write_text(header + "12.5\t0:00:12\t100\n")
    (tmp_path / "download_model.tsv").write_text(header + "40.0\t0:00:40\t50\n")
    (tmp_path / "notes.tsv").write_text("other\n1\n")
    assert stage_times(tmp_path) == [("download_model", 40.0), ("train/rho_07", 12.5)]


def test_evaluation_takes_reward_options_from_the_environment(tmp_path, monkeypatch):
    from marble.evaluate import merged_reward_options
    from beds.mirror import HPS_ARCH, replica_reward_options

    options = tmp_path / "reward_options.yaml"
    options.write_text(yaml.safe_dump(replica_reward_options(tmp_path)))
    monkeypatch.setenv("MARBLE_REWARD_OPTIONS", str(options))
    read = merged_reward_options(None)
    assert read["geneval"] == {"detector": "stub"} and read["hpsv2"]["arch"] == HPS_ARCH
    assert Path(read["hpsv2"]["model_config"]).is_absolute()
    # The workflow's eval.reward_options (inline JSON) is applied over the environment's,
    # option by option: the harness's detector stays, the flag's OCR rule is added.
    both = merged_reward_options('{"ocr": {"reference_rules": true}, "geneval": {"threshold": 0.4}}')
    assert both["ocr"] == {"reference_rules": True}
    assert both["geneval"] == {"detector": "stub", "threshold": 0.4}
    monkeypatch.delenv("MARBLE_REWARD_OPTIONS")
    assert merged_reward_options(None) == {}


def test_an_older_mirror_is_rebuilt(tmp_path):
    import json

    from beds.mirror import REPLICA_VERSION, is_current

    assert not is_current(tmp_path)
    (tmp_path / "mirror.json").write_text(json.dumps({"seed": 0, "repos": {}}))  # before versions
    assert not is_current(tmp_path)
    (tmp_path / "mirror.json").write_text(json.dumps({"seed": 0, "version": REPLICA_VERSION, "repos": {}}))
    assert is_current(tmp_path)


@pytest.fixture(scope="module")
def paper_mini_plan(tmp_path_factory):
    """(work dir, the shell commands of a forced dry run of paper + paper-mini `all`)."""
    from test_workflow_lib import copy_workflow, snakemake

    work = copy_workflow(tmp_path_factory.mktemp("paper") / "repo", config="config/paper.yaml")
    out = snakemake(["all", "-n", "-p", "-c1", "--forceall", "--configfile", *PAPER_MINI], work).stdout
    commands = [line for line in out.splitlines() if line.strip().startswith(("marble ", "MARBLE"))
                or " marble " in line or " marble." in line]
    return work, commands, out


def test_paper_mini_plans_no_cuda_job(paper_mini_plan):
    """The CPU harness keeps the paper's code paths but no job may ask for CUDA (the paper's
    fp16 embedding job on `cuda` crashed `make test-paper` on a machine without a GPU)."""
    _, commands, out = paper_mini_plan
    assert any("marble data embed" in c for c in commands), out[-2000:]
    assert not [c for c in commands if "--device cuda" in c or "cuda:" in c], commands


def test_paper_mini_evaluates_with_two_torchrun_ranks(paper_mini_plan):
    """eval.processes: 2 launches every evaluation job as 2 torchrun ranks (the paper path's
    multi-GPU evaluation), like training; before the key every job ran one process."""
    _, commands, out = paper_mini_plan
    evals = [c for c in commands if "--dataset" in c and "--output_dir" in c]
    runs = [n for n, r in yaml.safe_load((ROOT / ".test/paper-mini.yaml").read_text())["runs"].items() if r]
    # the 3 trained runs x 4 datasets + 6 public rows x 1 dataset
    assert len(runs) == 3 and len(evals) == len(runs) * 4 + 6, out[-2000:]
    assert sum("--lora_hf_path data/loras/flowgrpo_pickscore" in c for c in evals) == 1
    assert sum("--model_type generic" in c for c in evals) == 3
    launch = "torchrun --standalone --nnodes 1 --nproc_per_node 2 -m marble.evaluate"
    assert all(launch in c for c in evals), evals[0]


def test_more_eval_processes_than_gpus_is_refused(paper_mini_plan, tmp_path):
    from test_workflow_lib import snakemake

    work, _, _ = paper_mini_plan
    extra = tmp_path / "gpus.yaml"
    extra.write_text(yaml.safe_dump({"eval": {"processes": 4, "resources": {"gpus": 2}}}))
    proc = snakemake(["all", "-n", "-c1", "--configfile", *PAPER_MINI, str(extra)], work, check=False)
    assert proc.returncode != 0
    assert "eval.processes=4 > eval.resources.gpus=2" in proc.stdout + proc.stderr


def test_eval_rank_check_reads_only_this_invocations_run_info(tmp_path):
    import json
    import os

    from beds.paper_mini import eval_world_sizes, rank_problems

    def check_eval_ranks(expected, root, since):
        return rank_problems(eval_world_sizes(root, since), expected)

    def write(folder, world_size, mtime):
        path = tmp_path / folder / "run_info.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"world_size": world_size}))
        os.utime(path, (mtime, mtime))

    write("tiny-settings/marble/checkpoint-000020/ocr", 1, 1000.0)  # an earlier `make demo`
    write("paper-settings/rho_07/checkpoint-000002/ocr", 2, 2000.0)
    assert check_eval_ranks(2, tmp_path, since=1500.0) == []
    write("paper-settings/rho_07/checkpoint-000002/geneval", 1, 2000.0)
    problems = check_eval_ranks(2, tmp_path, since=1500.0)
    assert problems == [f"{tmp_path.as_posix()}/paper-settings/rho_07/checkpoint-000002/geneval: "
                        "world_size 1, expected 2 (eval.processes)"]


def test_harness_downloads_the_replicas_before_the_preflight():
    """The preflight's disk estimate guesses the paper's sizes (~150 GB) for files not yet on
    disk and refused a 70 GB-free machine; the harness downloads the mirror's tiny files first."""
    from beds.paper_mini import snakemake_commands

    first, second = snakemake_commands(list(PAPER_MINI), 2, ["all"])
    assert first == ["snakemake", "--configfile", *PAPER_MINI, "-c2", "data/models/sd35m", "data/reward_ckpts",
                     "data/raw"]
    assert second == ["snakemake", "--configfile", *PAPER_MINI, "-c2", "all"]


def test_paper_mini_refuses_first_when_results_hold_another_configs_runs(tmp_path, monkeypatch, capsys):
    """`make demo` then `make test-paper` in one checkout: the demo's tiny weighted_sum run sits
    where the paper's would train; the harness names it and stops before any download (training
    refused it after 1.4 min), and a folder of its own earlier run is no obstacle."""
    from beds import paper_mini

    def run_folder(name, preset, model):
        (tmp_path / "results/runs" / name).mkdir(parents=True)
        (tmp_path / "results/runs" / name / "config.yaml").write_text(
            yaml.safe_dump({"preset": preset, "model": {"path": model}}))

    run_folder("weighted_sum", "tiny_weighted_sum", "data/models/tiny-sd3")  # the demo's
    run_folder("rho_07", "rho_07", "data/models/sd35m")  # test-paper's own, resumable
    config = paper_mini.merged_config([str(ROOT / c) for c in PAPER_MINI])
    problems = paper_mini.foreign_runs(config, tmp_path / "results/runs")
    assert len(problems) == 1 and "weighted_sum: a run of preset tiny_weighted_sum" in problems[0]
    monkeypatch.setattr(paper_mini, "CONFIGS", tuple(str(ROOT / c) for c in PAPER_MINI))
    monkeypatch.setattr(paper_mini, "build_mirror", lambda *a, **k: pytest.fail("built the mirror"))
    monkeypatch.chdir(tmp_path)
    assert paper_mini.main(["--mirror", str(tmp_path / "mirror")]) == 2
    assert "move results/ aside" in capsys.readouterr().err and not (tmp_path / "mirror").exists()
