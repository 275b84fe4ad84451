"""`marble doctor`: the tiny default passes here; the paper config fails naming each missing
piece with its fix; the SLURM settings are checked against sinfo / sacctmgr."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
import yaml

from marble import doctor, doctor_slurm
from marble.workflow import configs

ROOT = Path(__file__).resolve().parents[1]


def _root(tmp_path: Path, config: str) -> Path:
    """A workflow folder with only the config and the schema (no data/)."""
    root = tmp_path / "wf"
    (root / "workflow/schemas").mkdir(parents=True)
    shutil.copy2(ROOT / "workflow/schemas/config.schema.yaml", root / "workflow/schemas")
    shutil.copy2(ROOT / config, root / "config.yaml")
    (root / "config").mkdir()  # an overlay's base (config/paper.yaml: overlay_on config/eval.yaml)
    shutil.copy2(ROOT / "config/eval.yaml", root / "config")
    return root


def test_tiny_default_passes(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sinfo: a laptop
    root = _root(tmp_path, "config.yaml")
    assert doctor.main(["--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "0 failure(s)" in out and "reward toy_brightness" in out and "built" in out


def test_paper_config_fails_naming_each_missing_piece(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("MARBLE_UNIFIEDREWARD_URL", "http://127.0.0.1:9/v1")  # closed port
    monkeypatch.setenv("PATH", str(tmp_path))  # no sinfo here
    root = _root(tmp_path, "config/paper.yaml")
    # config/paper.yaml's judge is started by the workflow (eval.unifiedreward.server); without
    # one, the client needs a running server, which is checked (and down here).
    config = configs.load(["config.yaml"], root)
    assert config["eval"]["unifiedreward"]["server"]
    config["eval"]["unifiedreward"] = {"server": None}
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    seen: list = []
    real = doctor.run_checks

    def spy(config: dict, root: Path, downloads_pending: bool = False,
            configfiles: tuple[str, ...] = (), local_jobs: bool = False, targets=()) -> list:
        seen.extend(real(config, root, downloads_pending, configfiles, local_jobs, targets))  # the real checks
        return seen

    monkeypatch.setattr(doctor, "run_checks", spy)
    assert doctor.main(["--root", str(root)]) == 1
    out = capsys.readouterr().out
    print(out)
    rows = {r.name: r for r in seen}
    for name in ["model files", "rewards files", "HF_TOKEN", "unifiedreward server"]:
        assert rows[name].status == "FAIL", (name, rows[name])
    assert "model_index.json (missing)" in rows["model files"].detail
    assert "snakemake --profile slurm prepare" in rows["model files"].fix and "HF_TOKEN" in rows["HF_TOKEN"].fix
    assert "sglang" in rows["unifiedreward server"].fix
    assert {"reward pickscore", "reward hpsv2", "reward ocr", "reward geneval", "ocr engine",
            "reward unifiedreward", "disk", "gpu", "torch"} <= set(rows)
    if importlib.util.find_spec("mmcv") is None:
        assert rows["mmcv-full"].status == "FAIL" and "workflow/envs/geneval.txt" in rows["mmcv-full"].fix
    if not __import__("torch").cuda.is_available():
        assert rows["gpu"].status == "warn" and "no GPU visible" in rows["gpu"].detail
    # The preflight rule runs before the downloads: missing files warn, HF_TOKEN still fails.
    pending = {r.name: r for r in doctor.asset_rows(doctor.load_workflow_config([], root), root,
                                                    downloads_pending=True)}
    assert pending["model files"].status == "warn" and pending["HF_TOKEN"].status == "FAIL"
    # The table names every failure, each with its fix on the next line.
    lines = out.splitlines()
    failed = [r.name for r in rows.values() if r.status == "FAIL"]
    assert f"{len(failed)} failure(s): {', '.join(failed)}" in out
    for i, line in enumerate(lines):
        if "  FAIL  " in line:
            assert lines[i + 1].strip().startswith("fix: "), line


def _stub(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / "bin" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(f"#!/bin/sh\n{text}\n")
    path.chmod(0o755)


def test_slurm_settings_are_checked_against_sinfo_and_sacctmgr(tmp_path, monkeypatch):
    _stub(tmp_path, "sinfo", 'case "$*" in *"-p gpu"*) echo "gpu gpu:h100:8";; *"-p cpu"*) echo "cpu (null)";; esac')
    _stub(tmp_path, "sacctmgr", "printf 'proj42\\nteam7\\n'")
    _stub(tmp_path, "scontrol", 'echo "Slurmctld(primary) at ctl is UP"')
    _stub(tmp_path, "sbatch", 'echo "sbatch: Job 1 to start at 2026-12-01T22:00:00" >&2')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    root = _root(tmp_path, "config/paper.yaml")
    (root / "site.yaml").write_text(yaml.safe_dump({"cluster": {
        "partition": "cpu", "gpu_partition": "gpu", "gpu_type": "a100", "account": "nope"}}))
    config = doctor.load_workflow_config(["config.yaml", "site.yaml"], root)
    rows = {r.name: r for r in doctor_slurm.slurm_rows(config)}
    assert rows["slurm partition"].status == "ok" and rows["slurm gpu_partition"].status == "ok"
    assert rows["slurm gres"].status == "FAIL" and "gpu:a100" in rows["slurm gres"].detail
    assert rows["slurm account"].status == "FAIL" and "proj42" in rows["slurm account"].detail
    config["cluster"].update(gpu_type="h100", account=None, gpu_partition="nogpu")
    rows = {r.name: r for r in doctor_slurm.slurm_rows(config)}
    assert rows["slurm gpu_partition"].status == "FAIL"
    assert rows["slurm account"].status == "FAIL" and "proj42, team7" in rows["slurm account"].fix


@pytest.mark.parametrize("bad, text, says", [
    ("nonexistent.yaml", None, "config file .*nonexistent.yaml does not exist"),
    ("broken.yaml", "eval: [1,\n", r"broken\.yaml line 2: not valid YAML"),
    ("list.yaml", "- 1\n", r"list\.yaml: a workflow config is a mapping")])
def test_a_missing_or_broken_config_file_is_one_line(tmp_path, bad, text, says):
    """A broken or non-mapping file was a yaml / AttributeError traceback (the doctor read files
    with its own loop; it now reads them as marble.workflow.configs does)."""
    if text is not None:
        (tmp_path / bad).write_text(text)
    with pytest.raises(SystemExit, match=f"^marble doctor: error: .*{says}"):
        doctor.load_workflow_config([bad], tmp_path)


def test_stand_in_detector_and_managed_judge_need_no_mmdet_or_running_server():
    """paper-mini's GenEval uses `detector: stub` and its judge is started per job by the
    workflow: the preflight must not demand mmdet/mmcv or a server already listening."""
    from marble.workflow import doctor_checks as checks

    assert checks.required_modules("geneval", {"detector": "stub"}) == ()
    assert "mmdet" in checks.required_modules("geneval", {})
    assert checks.managed_judge({"eval": {"unifiedreward": {"server": "sglang {port}"}}}) == "sglang {port}"
    assert checks.managed_judge({"eval": {}}) is None


def test_unpinned_hub_references_fail_the_preflight_naming_each_key():
    """The fetch refuses a hub reference without a commit, so a run would stop at its first
    download: the preflight names each one with how to pin or drop it. paper-mini drops them."""
    from marble.workflow import doctor_checks as checks

    paper = configs.load(["config/paper.yaml"], ROOT)
    unpinned = checks.unpinned_hub_references(paper)
    assert set(unpinned) == {"eval.checkpoints.flowgrpo_geneval", "eval.checkpoints.flowgrpo_ocr",
                             "eval.unifiedreward.model"}  # diffusionnft_multireward: pinned
    assert "eval.protocols.sdxl.model" in checks.hub_references(paper)  # pinned: not listed
    rows = {r.name: r for r in doctor.hub_rows(paper)}
    row = rows["hub pin eval.checkpoints.flowgrpo_ocr"]
    assert row.status == "FAIL" and "PIN-A-COMMIT" in row.detail
    assert "huggingface.co/jieliu/SD3.5M-FlowGRPO-Text HEAD" in row.fix
    assert row.fix.startswith("`marble hub lock --configfile")  # pins every placeholder at once
    assert "eval.checkpoints.flowgrpo_ocr: null" in row.fix
    bad = {"eval": {"protocols": {"sdxl": {"model": "hf:stabilityai/sdxl@main"}}}}
    assert "eval.checkpoints.sdxl: null" in doctor.hub_rows(bad)[0].fix
    mini = checks.merge(paper, yaml.safe_load((ROOT / ".test/paper-mini.yaml").read_text()))
    assert checks.unpinned_hub_references(mini) == {}
    assert [r.status for r in doctor.hub_rows(mini)] == ["ok"]


def _paper_site(tmp_path: Path, **cluster) -> dict:
    root = _root(tmp_path, "config/paper.yaml")
    (root / "site.yaml").write_text(yaml.safe_dump({"cluster": {
        "partition": "cpu", "gpu_partition": "gpu", "gpu_type": "h100", "account": "proj42",
        **cluster}}))
    return doctor.load_workflow_config(["config.yaml", "site.yaml"], root)


def test_a_job_shape_the_partition_cannot_hold_is_named_with_slurms_reason(tmp_path, monkeypatch):
    """sbatch --test-only with the job's own options: the 2-node x 8-GPU training is refused,
    the 1-GPU jobs fit; the row names the job, its shape and SLURM's words."""
    _stub(tmp_path, "sinfo", 'echo "gpu gpu:h100:8"')
    _stub(tmp_path, "sacctmgr", "echo proj42")
    # (time limits: tests/test_slurm_limits.py; here no partition has one)
    _stub(tmp_path, "scontrol", 'case "$1" in show) echo "PartitionName=gpu Default=YES MaxTime=UNLIMITED";; '
          '*) echo "Slurmctld(primary) at ctl is UP";; esac')
    _stub(tmp_path, "sbatch", 'echo "$*" >> "$0.calls"; case "$*" in *--nodes=2*) '
          'echo "sbatch: error: Batch job submission failed: Requested node configuration is '
          'not available" >&2; exit 1;; esac; echo "sbatch: Job 3 to start at now" >&2')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    rows = {r.name: r for r in doctor_slurm.slurm_rows(_paper_site(tmp_path))}
    train = rows["slurm fits train_run"]
    assert train.status == "FAIL" and "node configuration is not available" in train.detail
    assert "2 nodes x gpu:h100:8" in train.detail and "2880 min" in train.detail
    assert "train.nodes" in train.fix
    assert rows["slurm fits evaluate_ckpt"].status == "ok"
    calls = (tmp_path / "bin/sbatch.calls").read_text()
    assert "--test-only" in calls and "--ntasks-per-node=1" in calls and "--account=proj42" in calls


def test_no_controller_is_a_warning_not_account_ok(tmp_path, monkeypatch):
    _stub(tmp_path, "sinfo", "exit 1")
    _stub(tmp_path, "scontrol", 'echo "Slurmctld(primary) at ctl is DOWN"; exit 1')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    rows = doctor_slurm.slurm_rows(_paper_site(tmp_path))
    assert [(r.name, r.status) for r in rows] == [("slurm controller", "warn")]
    assert "DOWN" in rows[0].detail


def test_unset_user_asks_sacctmgr_for_the_process_owner(tmp_path, monkeypatch):
    _stub(tmp_path, "sacctmgr", 'echo "$*" > "$0.args"; exit 1')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    monkeypatch.delenv("USER", raising=False)
    monkeypatch.delenv("LOGNAME", raising=False)
    row = doctor_slurm.account_row("proj42")
    import getpass
    assert f"user={getpass.getuser()}" in (tmp_path / "bin/sacctmgr.args").read_text()
    assert row.status == "warn"  # sacctmgr failed: unknown, never "ok"


def test_every_gated_hub_model_still_to_fetch_needs_the_token(tmp_path, monkeypatch):
    """SD3.5-L and FLUX.1-Dev are gated like SD3.5-M: HF_TOKEN while either is to be fetched."""
    config = _paper_site(tmp_path)
    root = tmp_path / "wf"
    monkeypatch.delenv("HF_TOKEN", raising=False)
    row, = doctor.gated_rows(config, root)
    assert row.status == "FAIL" and "SD3.5 Large" in row.detail and "FLUX.1-Dev" in row.detail
    from marble.workflow import evaluation as wf_eval
    for folder, (ref, _) in wf_eval.hub_models(config["eval"]).items():
        if "FLUX" in ref:
            (root / wf_eval.HUB_MODEL_DIR / folder).mkdir(parents=True)
    row, = doctor.gated_rows(config, root)
    assert "FLUX.1-Dev" not in row.detail and "SD3.5 Large" in row.detail
    monkeypatch.setenv("HF_TOKEN", "hf_x")
    assert doctor.gated_rows(config, root) == []


def test_the_judges_environment_must_exist_and_import_sglang(tmp_path, monkeypatch):
    """config/paper.yaml starts the judge with `conda run -n marble-sglang`: the doctor runs
    that environment's python (a missing env fails naming the recipe); a venv python too."""
    from marble.workflow import doctor_checks as checks

    from marble.workflow import configs

    server = configs.load(["config/paper.yaml"], ROOT)["eval"]["unifiedreward"]["server"]
    assert checks.judge_probe(server) == ["conda", "run", "-n", "marble-sglang", "python", "-c",
                                          "import sglang"]
    assert checks.judge_probe(".venv-sglang/bin/python -m sglang.launch_server --port {port}") == [
        ".venv-sglang/bin/python", "-c", "import sglang"]
    assert checks.judge_probe("python -m beds.fake_sglang --port {port}") is None
    _stub(tmp_path, "conda", 'echo "EnvironmentLocationNotFound: Not a conda environment: $4" >&2; exit 1')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    row = doctor._unifiedreward_row({}, managed=server)
    assert row.status == "FAIL" and "Not a conda environment" in row.detail
    assert "workflow/envs/sglang.yaml" in row.fix
    _stub(tmp_path, "conda", "exit 0")
    assert doctor._unifiedreward_row({}, managed=server).status == "ok"
    # No conda at all: named as such, with the way without it.
    (tmp_path / "bin/conda").unlink()
    row = doctor._unifiedreward_row({}, managed=server)
    assert row.status == "FAIL" and "`conda` is not installed here" in row.detail
    assert "install conda" in row.fix and "workflow/envs/sglang.txt" in row.fix


def test_a_schema_error_names_the_file_that_sets_the_key(tmp_path):
    """Not the last --configfile: the one holding the bad key, in one line."""
    root = _root(tmp_path, "config/paper.yaml")
    (root / "bad.yaml").write_text("train:\n  bogus: 1\n")
    (root / "site.yaml").write_text("cluster:\n  partition: cpu\n")
    with pytest.raises(SystemExit) as err:
        doctor.load_workflow_config(["config.yaml", "bad.yaml", "site.yaml"], root)
    line = str(err.value)
    assert "\n" not in line and "bad.yaml: train.bogus: Additional properties" in line
    (root / "bad.yaml").write_text("train:\n  nodes: two\n")
    with pytest.raises(SystemExit, match=r"bad\.yaml: train\.nodes: 'two' is not of type"):
        doctor.load_workflow_config(["config.yaml", "bad.yaml", "site.yaml"], root)


def test_key_owner_takes_the_last_layer_that_sets_the_key():
    from marble.workflow.doctor_checks import key_owner

    layers = [{"train": {"nodes": 2}}, {"train": {"nodes": 1}}, {"cluster": {}}]
    assert key_owner(layers, ["train", "nodes"]) == 1
    assert key_owner(layers, ["train", "gpus"]) == 1  # the deepest prefix: train
    assert key_owner(layers, ["eval", "limit"]) is None  # a schema default


def test_disk_estimate_adds_what_evaluation_writes_and_dvc_copies_only_through_dvc(tmp_path, monkeypatch):
    """Hub models still to fetch, LoRAs, evaluation outputs and DVC's cache copies are in the
    estimate; a model folder that exists but does not verify still counts as to download;
    before the downloads a shortfall made only of guessed parts is a warning."""
    from marble.workflow import doctor_checks as checks

    config = _paper_site(tmp_path)
    root = tmp_path / "wf"
    (root / config["model_dir"]).mkdir(parents=True)  # exists, holds nothing the manifest lists
    need, parts = checks.disk_estimate(config, root)
    for part in ("model", "hub models (guessed)", "LoRAs", "evaluations (guessed)"):
        assert part in parts, parts
    assert "DVC cache" not in parts
    (root / ".dvc").mkdir()
    # `snakemake --profile slurm all` in a DVC repository never writes DVC's cache ...
    assert checks.disk_estimate(config, root) == (need, parts)
    # ... `dvc repro` / `dvc exp run` (their stages run Snakemake with DVC_STAGE set) do.
    need_dvc, parts_dvc = checks.disk_estimate(config, root, via_dvc=True)
    assert "DVC cache copies" in parts_dvc and need_dvc == pytest.approx(2 * need, rel=1e-3)
    assert checks.guessed_gb(parts_dvc) > 0
    counted = need_dvc - checks.guessed_gb(parts_dvc)
    usage = type("Usage", (), {"free": (counted + 1) * 2**30})
    monkeypatch.setattr(doctor.shutil, "disk_usage", lambda _: usage)
    monkeypatch.setenv("DVC_STAGE", "train")
    assert doctor.disk_row(config, root, downloads_pending=True).status == "warn"
    assert doctor.disk_row(config, root).status == "FAIL"
    # Room for the outputs but not their copies: through DVC a failure, Snakemake alone fits;
    # its row says what DVC would add.
    usage.free = (need + 1) * 2**30
    assert doctor.disk_row(config, root).status == "FAIL"
    monkeypatch.delenv("DVC_STAGE")
    row = doctor.disk_row(config, root)
    assert row.status == "ok" and "DVC cache" not in row.detail.split(";")[1]
    assert f"through `dvc repro` / `dvc exp run` ~{need_dvc - need:.1f} GB more" in row.detail


def test_local_jobs_skip_slurm_even_where_a_daemon_answers(monkeypatch):
    """A local run (`snakemake -c2`, the preflight passes --local-jobs) submits nothing: SLURM's
    job-shape checks would fail GPU shapes on a CPU daemon that never gets them."""
    monkeypatch.setattr(doctor, "slurm_rows", lambda *a: [doctor.Check("slurm fits train_run", doctor.FAIL, "x")])
    config = doctor.load_workflow_config([], ROOT)  # the tiny default
    local = doctor.run_checks(config, ROOT, local_jobs=True)
    assert [r.status for r in local if r.name.startswith("slurm")] == [doctor.SKIP]
    submitted = doctor.run_checks(config, ROOT)
    assert [r.status for r in submitted if r.name.startswith("slurm")] == [doctor.FAIL]


def test_in_a_container_without_the_slurm_client_it_warns(tmp_path, monkeypatch):
    """In the image (--sdm apptainer) a missing sinfo is a warning that names the bind, not a
    quiet skip: the jobs still go to SLURM and a training job needs srun (docs/container.md)."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no sinfo
    monkeypatch.delenv("SINGULARITY_CONTAINER", raising=False)
    config = doctor.load_workflow_config(["config.yaml"], _root(tmp_path, "config.yaml"))
    assert [r.status for r in doctor.slurm_rows(config)] == [doctor.SKIP]  # a laptop
    monkeypatch.setenv("APPTAINER_CONTAINER", "/project/images/marble.sif")
    (row,) = doctor.slurm_rows(config)
    assert row.status == doctor.WARN and "/project/images/marble.sif" in row.detail and "srun" in row.detail
    assert "docs/container.md" in row.fix


def test_kept_checkpoints_are_the_plans_size_times_each_runs_keep():
    """One checkpoint size model (marble.workflow.cost.checkpoint_gb, what the plan prices a
    write with) times each run's own `train.keep_checkpoints` (not a hard-coded 3)."""
    from marble.config import load_config
    from marble.workflow import cost
    from marble.workflow import doctor_checks as checks
    from marble.workflow.flops import load_table

    config = {"runs": {"a": {"preset": "tiny", "set": ["train.keep_checkpoints=1"]},
                       "b": {"preset": "tiny", "set": ["train.keep_checkpoints=5"]}}}
    cfg = load_config("tiny")
    one = cost.checkpoint_gb(cfg, load_table())
    assert one > 0 and cost.checkpoint_seconds(cfg, load_table())[2] == pytest.approx(one)
    assert checks.kept_checkpoints_gb(config) == pytest.approx(6 * one)


def test_a_run_at_an_uncounted_batch_or_rank_is_sized_from_its_models_counted_lora():
    """paper-mini trains SD3.5M at rank 4 and batch 2, a shape the FLOPs table does not count:
    the disk estimate sizes its checkpoints from a counted SD3.5M shape, scaled by rank (a
    LoRA's size is linear in r), instead of stopping the preflight with a traceback."""
    from marble.config import load_config
    from marble.workflow import cost
    from marble.workflow.flops import Missing, load_table, micro_key

    table = load_table()
    paper = load_config("sd35m")
    small = load_config("sd35m", overrides=["model.lora_rank=4", "train.batch_size=2", "sampling.batch_size=2",
                                            "sampling.resolution=64"])
    assert micro_key(small) not in table["micro_step"]
    assert cost.lora_params(small, table) * paper.model.lora_rank == cost.lora_params(paper, table) * 4
    assert cost.lora_params(paper, table) == table["micro_step"][micro_key(paper)]["lora_params"]
    with pytest.raises(Missing, match="micro_step"):
        cost.lora_params(small, {"micro_step": {}})
