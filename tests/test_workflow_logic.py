"""marble.workflow: the workflow's logic as pure functions, tested without Snakemake."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from marble.workflow import checkpoints, evaluation, runs, slurm

CLUSTER = dict(partition="cpu", gpu_partition="gpu", account="proj1", gpu_type="h200",
               constraint="hopper")
TRAIN = dict(nodes=2, gpus_per_node=8, tasks=None, cpus_per_task=32, mem_mb=480000,
             runtime=2880, requeue_signal_s=600)
EVAL = dict(num_inference_steps=40, guidance_scale=1.0, resolution=512, mixed_precision="fp16",
            reward_options={}, limit=None, save_images=False, rewards={"ocr": ["ocr"]},
            processes=None, resources=dict(gpus=2, cpus_per_task=8, mem_mb=64000, runtime=60))


def test_train_resources_two_nodes():
    res = slurm.train_resources(TRAIN, CLUSTER)
    assert (res["nodes"], res["tasks"], res["mpi"]) == (2, 2, "srun")
    assert res["gres"] == "gpu:h200:8" and res["slurm_partition"] == "gpu"
    assert res["slurm_account"] == "proj1" and res["constraint"] == "hopper"
    assert res["slurm_extra"] == "--signal=USR1@600 --ntasks-per-node=1"


def test_one_node_training_asks_for_the_requeue_signal_too():
    res = slurm.train_resources({**TRAIN, "nodes": 1}, CLUSTER)
    assert (res["nodes"], res["tasks"], res["mpi"]) == (1, 1, "")
    assert res["slurm_extra"] == "--signal=USR1@600 --ntasks-per-node=1"
    res = slurm.train_resources({**TRAIN, "nodes": 1, "requeue_signal_s": 0}, CLUSTER)
    assert "--signal" not in res["slurm_extra"]


def test_cpu_job_takes_the_cpu_partition_and_no_gres():
    res = slurm.job_resources(dict(gpus=0, cpus_per_task=2, mem_mb=4000, runtime=10), CLUSTER)
    assert res == dict(cpus_per_task=2, mem_mb=4000, runtime=10, slurm_partition="cpu",
                       slurm_account="proj1")


def test_run_overrides_and_args_are_quoted():
    spec = dict(preset="tiny", max_steps=3, set=["train.lr=1e-4", "data.note=a b;c"])
    sets = runs.run_overrides(spec, "data/my model", "data/datasets/x", None)
    assert sets[0] == "model.path=data/my model" and sets[-1] == "data.note=a b;c"
    args = runs.train_args(spec, sets)
    words = shlex.split(args)  # the shell sees exactly the overrides, nothing executes
    assert words.count("--set") == len(sets) and "data.note=a b;c" in words
    assert words[-2:] == ["--max-steps", "3"]
    assert runs.final_step(spec, ["train.lr=1e-4"]) == 3  # max_steps wins over the preset
    assert runs.checkpoint_name(3) == "checkpoint-000003"


def test_settings_name_changes_with_every_image_setting_only():
    base = evaluation.settings_name(EVAL, "data/model")
    assert base.startswith("n40-r512-g1.0-fp16-")
    assert evaluation.settings_name({**EVAL, "limit": 4}, "data/model") == base
    assert evaluation.settings_name(EVAL, "./data/model") == base  # normalised path
    for key, value in [("guidance_scale", 4.5), ("num_inference_steps", 20),
                       ("mixed_precision", "bf16"), ("reward_options", {"ocr": {"x": 1}}),
                       ("numerics", "reference")]:
        assert evaluation.settings_name({**EVAL, key: value}, "data/model") != base, key
    # `numerics: marble` (the project's) keeps the folder names of runs made before the key;
    # the reference's numerics (config/eval.yaml's default) never write into those folders.
    assert evaluation.settings_name({**EVAL, "numerics": "marble"}, "data/model") == base
    words = shlex.split(evaluation.evaluate_args({**EVAL, "numerics": "reference"}, "ocr"))
    assert words[words.index("--numerics") + 1] == "reference"


def test_eval_launcher_and_processes():
    assert evaluation.processes(EVAL) == 2
    assert evaluation.launcher(1) == "marble evaluate"
    assert "--nproc_per_node 2 -m marble.evaluate" in evaluation.launcher(2)
    with pytest.raises(ValueError, match="eval.processes=3 > eval.resources.gpus=2"):
        evaluation.processes({**EVAL, "processes": 3})


def test_evaluate_args_quote_reward_options():
    cfg = {**EVAL, "reward_options": {"ocr": {"engine": "x'; touch PWNED; '"}}, "limit": 2}
    words = shlex.split(evaluation.evaluate_args(cfg, "ocr"))
    assert words[words.index("--limit") + 1] == "2"
    assert '"engine": "x\'; touch PWNED; \'"' in words[words.index("--reward_options") + 1]
    assert evaluation.source_args("base", None) == ""
    assert shlex.split(evaluation.source_args("runs/a b/ckpt", None)) == [
        "--checkpoint_path", "runs/a b/ckpt"]
    assert evaluation.source_args("hf:o/r", "data/loras/x") == "--lora_hf_path data/loras/x"


def test_hub_sources_and_labels():
    assert checkpoints.hub_source("hf:org/name") == ("org/name", "main")
    assert checkpoints.hub_source("hf:org/name@abc123") == ("org/name", "abc123")
    assert checkpoints.hub_source("org/name") is None  # a relative folder, not the hub
    assert checkpoints.checkpoint_label("hf:org/name@v1.0") == "hub-v1.0"
    assert checkpoints.checkpoint_label("base") == "base"
    assert checkpoints.checkpoint_label("results/runs/a/checkpoints/checkpoint-000010") == \
        "checkpoint-000010"
    with pytest.raises(ValueError, match="not a hub LoRA reference"):
        checkpoints.hub_source("hf:a/b/c")


def fake_checkpoint(folder, payload=b"weights"):
    """A checkpoint folder with one file and a real marker (the trainer's format)."""
    from marble.training.checkpoint_format import COMPLETE, marker_text

    folder.mkdir(parents=True)
    (folder / "state.pt").write_bytes(payload)
    (folder / COMPLETE).write_text(marker_text(folder))
    return folder


def test_scanned_checkpoints_name_clashes_apart(tmp_path):
    for parent in ("one", "two"):
        fake_checkpoint(tmp_path / parent / "marble" / "checkpoints" / "checkpoint-000004")
    (tmp_path / "one" / "marble" / "checkpoints" / "checkpoint-000008").mkdir()  # no marker
    found = checkpoints.scanned_checkpoints([str(tmp_path / "one"), str(tmp_path / "two")])
    assert sorted(found) == [("marble", "checkpoint-000004"), ("marble-two", "checkpoint-000004")]


def test_merge_catalogue_refuses_one_name_for_two_folders(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    same = checkpoints.merge_catalogue({("r", "c"): str(a)}, {("r", "c"): str(tmp_path / "." / "a")})
    assert same == {("r", "c"): str(a)}
    with pytest.raises(ValueError, match="names two folders"):
        checkpoints.merge_catalogue({("r", "c"): str(a)}, {("r", "c"): str(b)})


def test_row_protocol_overrides_and_refuses_unknown_keys():
    cfg = {**EVAL, "datasets": ["ocr"], "protocols": {"flux": {"guidance_scale": 3.5, "model_type": "generic",
                                                               "model": "hf:bfl/flux@" + "b" * 40}}}
    row = evaluation.row_protocol(cfg, "flux")
    assert row["guidance_scale"] == 3.5 and row["num_inference_steps"] == 40
    assert evaluation.row_protocol(cfg, "other")["model_type"] == "sd3"
    assert evaluation.model_folder(row, "data/m") == "data/models/hub/bfl--flux-bbbbbbbbbbbb"
    assert evaluation.row_settings(cfg, "flux", "data/m") != evaluation.row_settings(cfg, "other", "data/m")
    # A row without its own protocol keeps the folder name it had before protocols existed.
    assert evaluation.row_settings(cfg, "other", "data/m") == evaluation.settings_name(EVAL, "data/m")
    assert "--model_type generic" in evaluation.evaluate_args(row, "ocr")
    with pytest.raises(ValueError, match="eval.protocols.bad: unknown key"):
        evaluation.row_protocol({**cfg, "protocols": {"bad": {"cfg": 1}}}, "bad")
    evaluation.check_protocol_names(cfg, {"flux", "other"})
    with pytest.raises(ValueError, match=r"eval.protocols: \['flux'\] name no run"):
        evaluation.check_protocol_names(cfg, {"other"})


def test_pinned_revision_and_pipeline_patterns():
    from marble.assets.hub import pipeline_patterns
    from marble.assets.hub_ref import pinned_revision

    assert pinned_revision("x", "a" * 40) == "a" * 40
    for rev in (None, "main", "PIN-A-COMMIT"):
        with pytest.raises(ValueError, match="not a 40-hex commit"):
            pinned_revision("hf:o/r", rev)
    index = {"_class_name": "FluxPipeline", "transformer": ["diffusers", "FluxTransformer2DModel"],
             "vae": ["diffusers", "AutoencoderKL"], "image_encoder": [None, None]}
    assert pipeline_patterns(index) == ["model_index.json", "transformer/*", "vae/*"]


def test_hub_snapshot_retries_transient_errors_only(tmp_path, monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    from marble.assets import hub
    from marble.assets.download import DownloadError

    calls = []

    def response(status):
        import httpx

        return httpx.Response(status, request=httpx.Request("GET", "https://huggingface.co/api/models/o/r"))

    def fake_snapshot_download(repo_id, *, revision=None, token=None, local_dir=None,
                               allow_patterns=None, ignore_patterns=None, **kwargs):
        calls.append(repo_id)
        if len(calls) < 3:
            raise HfHubHTTPError("503 Service Unavailable", response=response(503))
        Path(local_dir).mkdir(parents=True)
        (Path(local_dir) / "adapter_config.json").write_text("{}")
        return local_dir

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    sleeps = []
    out = hub.snapshot("o/lora", "a" * 40, tmp_path / "lora", sleep=sleeps.append)
    assert out == tmp_path / "lora" and (out / "adapter_config.json").is_file()
    assert len(calls) == 3 and sleeps == [2.0, 4.0] and not (tmp_path / "lora.partial").exists()

    def missing(repo_id, **kwargs):
        calls.append(repo_id)
        raise RepositoryNotFoundError("no such repo", response=response(404))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", missing)
    calls.clear()
    with pytest.raises(DownloadError, match="RepositoryNotFoundError"):
        hub.snapshot("o/gone", "a" * 40, tmp_path / "gone", sleep=sleeps.append)
    assert len(calls) == 1  # not retried


def test_folder_names_with_spaces_become_wildcard_values(tmp_path):
    assert checkpoints.checkpoint_label("data/my lora") == "my_lora"
    assert checkpoints.checkpoint_label("data/.hidden") == "lora.hidden"
    fake_checkpoint(tmp_path / "my run" / "checkpoints" / "checkpoint-000002")
    assert list(checkpoints.scanned_checkpoints([str(tmp_path)])) == [("my_run", "checkpoint-000002")]


def test_scan_skips_a_damaged_checkpoint_and_eval_input_names_it(tmp_path):
    good = fake_checkpoint(tmp_path / "r" / "checkpoints" / "checkpoint-000002")
    bad = fake_checkpoint(tmp_path / "r" / "checkpoints" / "checkpoint-000004")
    (bad / "state.pt").write_bytes(b"flipped")
    assert list(checkpoints.scanned_checkpoints([str(tmp_path)])) == [("r", "checkpoint-000002")]
    assert checkpoints.checkpoint_input(str(good)) == str(good / "COMPLETE")
    with pytest.raises(ValueError, match=r"checkpoint-000004 is damaged: state.pt \(sha256"):
        checkpoints.checkpoint_input(str(bad))
    lora = tmp_path / "bare"  # a bare LoRA (no marker): the folder itself
    lora.mkdir()
    assert checkpoints.checkpoint_input(str(lora)) == str(lora)


def test_dvc_sync_touches_upstream_and_the_current_prefix_only():
    from marble.workflow import dvc_sync

    spec = {"stages": {name: {"cmd": f"python -m marble.workflow.dvc_sync stage {name} -- "
                                     f"snakemake {name} --profile p -c2"}
                       for name in ["prepare", "train", "evaluate", "report"]}}
    targets = dvc_sync.stage_targets(spec)
    assert list(targets.values()) == ["prepare", "train", "evaluate", "report"]
    assert dvc_sync.upstream_targets(targets, "evaluate") == ["prepare", "train"]
    assert dvc_sync.upstream_targets(targets, "prepare") == []
    with pytest.raises(ValueError, match="no stage 'bench'"):
        dvc_sync.upstream_targets(targets, "bench")
    # After a pull: evaluate changed -> only prepare and train are touched, not report
    # (its target would touch evaluate's jobs too).
    changed = dvc_sync.changed_stages('{"dvc.yaml:evaluate": [{"changed deps": {}}]}')
    assert changed == {"evaluate"}
    assert dvc_sync.current_prefix(targets, changed) == ["prepare", "train"]
    assert dvc_sync.current_prefix(targets, dvc_sync.changed_stages("{}")) == list(targets.values())


# A stand-in for Snakemake under `dvc_sync stage`: on SIGINT or SIGTERM it takes a second to
# clean up (as Snakemake cancels its jobs and removes its lock), records it, and exits 130.
_SLOW_CLEANUP = """
import pathlib, signal, sys, time
def stop(signum, frame):
    time.sleep(float(sys.argv[3]) if len(sys.argv) > 3 else 1.0)
    with open(sys.argv[1], "a") as log:  # every signal that reached it, in order
        log.write(signal.Signals(signum).name + " ")
    sys.exit(130)
signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGTERM, stop)
pathlib.Path(sys.argv[2]).touch()
time.sleep(60)
"""


@pytest.mark.parametrize("how", ["Ctrl-C", "kill <wrapper pid>", "kill -9 <dvc pid>",
                                 "SIGTERM <dvc group>"])
def test_dvc_sync_lets_its_command_clean_up_when_interrupted(tmp_path, how):
    """Ctrl-C (SIGINT to the process group) of `dvc repro` SIGKILLed Snakemake 0.25 s into
    its cleanup (subprocess.run's KeyboardInterrupt path): its lock stayed behind, with a
    traceback. SIGTERM to the wrapper alone, or the death of DVC (no SIGTERM handler; kill
    -9), left Snakemake running headless. Now the command gets the signal once (Ctrl-C's
    when DVC is gone), cleans up, and its status is the wrapper's. A SIGTERM to DVC's whole
    group (systemd, `timeout`) kills DVC at once: the command has its SIGTERM already and
    gets no Ctrl-C after it (that would cut a training job's checkpointing stop short)."""
    import os
    import signal
    import time

    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  prepare:\n    cmd: python -m marble.workflow.dvc_sync stage prepare -- snakemake prepare\n")
    (tmp_path / "child.py").write_text(_SLOW_CLEANUP)
    done, ready = tmp_path / "cleaned", tmp_path / "ready"
    wrapper = [sys.executable, "-m", "marble.workflow.dvc_sync", "stage", "prepare", "--",
               sys.executable, "child.py", str(done), str(ready), "3" if "group" in how else "1"]
    if how.startswith(("kill -9", "SIGTERM")):  # a stand-in for DVC: runs the stage command and waits
        wrapper = [sys.executable, "-c", "import subprocess, sys; subprocess.run(sys.argv[1:])", *wrapper]
    proc = subprocess.Popen(wrapper, cwd=tmp_path, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.time() + 60
    while not ready.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert ready.exists(), proc.communicate()[1]
    if how == "Ctrl-C":
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal does: the whole group
    elif "group" in how:
        os.killpg(proc.pid, signal.SIGTERM)  # DVC and the wrapper (the command's group is its own)
    else:
        os.kill(proc.pid, signal.SIGKILL if how.startswith("kill -9") else signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    while not done.exists() and time.time() < deadline:  # the command outlives a killed DVC
        time.sleep(0.05)
    time.sleep(4 if "group" in how else 0)  # a Ctrl-C that followed would be logged by now
    assert done.read_text().split() == (["SIGTERM"] if how in ("kill <wrapper pid>", "SIGTERM <dvc group>")
                                        else ["SIGINT"]), err
    if not how.startswith(("kill -9", "SIGTERM")):
        assert proc.returncode == 130 and "Traceback" not in err, err


def test_a_nulled_row_is_dropped_not_evaluated_as_a_folder_named_none():
    """An overlay cannot delete a key (Snakemake merges --configfile dicts), so
    `eval.checkpoints.<row>: null` / `runs.<name>: null` drop a row."""
    entries = {"sd35m": "base", "flowgrpo_ocr": None, "lora": "hf:o/r@" + "a" * 40}
    assert checkpoints.named_checkpoints(entries) == {("sd35m", "base"): "base",
                                                      ("lora", "hub-" + "a" * 40): "hf:o/r@" + "a" * 40}
    assert checkpoints.hub_loras(entries) == {"lora": ("o/r", "a" * 40)}
    assert runs.configured({"rho_07": {"preset": "rho_07"}, "rho_01": None}) == {"rho_07": {"preset": "rho_07"}}
    assert runs.configured(None) == {}
    cfg = {"checkpoints": entries, "protocols": {
        "flowgrpo_ocr": {"guidance_scale": 4.5, "model": "hf:x/gone@" + "b" * 40},
        "sdxl_row": {"model": "hf:x/sdxl@" + "c" * 40, "model_type": "generic"}}}
    # A nulled row's base model is not fetched; its protocol (in the base config) is no typo.
    assert set(evaluation.hub_models(cfg)) == {"x--sdxl-cccccccccccc"}
    evaluation.check_protocol_names(cfg, {"sd35m", "lora", "sdxl_row"}, dropped={"flowgrpo_ocr"})
    with pytest.raises(ValueError, match=r"eval.protocols: \['flowgrpo_ocr'\]"):
        evaluation.check_protocol_names(cfg, {"sd35m", "lora", "sdxl_row"})


def test_table1_waits_for_the_published_rows_only(tmp_path):
    published = tmp_path / "published.yaml"
    published.write_text('rows:\n  "SD-XL": {run: sdxl}\n  "+ MARBLE": {run: rho_07}\n')
    assert evaluation.published_runs(str(published)) == {"sdxl", "rho_07"}
    assert evaluation.published_runs(None) == set()


def test_the_workflow_modules_load_no_torch():
    """Snakemake imports these to build every DAG (each dry run, each DVC stage): torch would
    add ~3.5 s to every invocation, and deciding which evaluations need the judge did import it."""
    code = ("import sys\n"
            "from marble.workflow import checkpoints, evaluation, plan, runs, slurm\n"
            "ev = {'rewards': {}, 'unifiedreward': {'server': 'x --port {port}'}}\n"
            "assert evaluation.needs_judge(ev, 'drawbench') and not evaluation.needs_judge(ev, 'ocr')\n"
            "heavy = sorted(m for m in ('torch', 'diffusers', 'transformers') if m in sys.modules)\n"
            "assert not heavy, heavy\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_final_step_reads_a_runs_presets_once(monkeypatch):
    """Many input functions ask for a run's final checkpoint while the DAG is built (642 calls
    in one tiny `snakemake -n report`): the preset chain is read once per run, not per call."""
    from marble.workflow import runs

    calls = []
    real = runs.load_config
    monkeypatch.setattr(runs, "load_config", lambda *a, **k: calls.append(a) or real(*a, **k))
    runs._max_steps.cache_clear()
    spec = {"preset": "tiny", "max_steps": 3, "set": []}
    assert {runs.final_step(spec, ["train.save_every=1"]) for _ in range(20)} == {3}
    assert runs.final_step({**spec, "max_steps": None}, []) == runs.load_config("tiny").train.max_steps
    assert len(calls) == 2 + 1  # one per distinct (preset, overrides), + the direct call above
    runs._max_steps.cache_clear()
