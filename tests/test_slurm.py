"""The SLURM profile: the sbatch call the plugin builds for the paper-scale training job
(stub sbatch on PATH), and the tiny pipeline through a real localhost SLURM with the
training job as 2 tasks = 2 torchrun nodes."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from marble.training.run_lock import lock_path
from test_workflow_lib import (  # noqa: F401  (tiny_pipeline is a fixture)
    BIN,
    ROOT,
    copy_inputs,
    copy_workflow,
    env,
    snakemake,
    tiny_pipeline,
)

SLURM_SCRIPTS = ROOT / "tests" / "slurm"

STUB = """#!/bin/sh
# stub {name}: records its argv (and stdin for sbatch) under $STUB_DIR
printf '%s\\n' "$@" > "$STUB_DIR/{name}.argv"
case {name} in
  sbatch) cat > "$STUB_DIR/sbatch.stdin"; echo 4242 ;;
  scontrol) echo "MinJobAge = 600 sec" ;;
  sacctmgr|sshare) echo "proj42" ;;
esac
exit 0
"""


def _paper_inputs(work: Path) -> None:
    """Placeholders for the training rule's inputs, so the DAG is just the train job."""
    for d in ["data/models/sd35m", "data/reward_ckpts", "data/datasets/paper/embeddings"]:
        (work / d).mkdir(parents=True, exist_ok=True)
    for f in ["data/datasets/paper/train.parquet", "data/datasets/paper/test.parquet"]:
        (work / f).write_bytes(b"placeholder")
    old = time.time() - 3600
    for p in (work / "data").rglob("*"):
        os.utime(p, (old, old))


def test_sbatch_call_for_paper_training(tmp_path):
    """The real plugin builds the sbatch call for one paper run: 2 nodes x 8 GPUs of the
    configured type on the GPU partition and account, one task per node, no
    --ntasks-per-gpu, requeue (the plugin's own flag) + signal, the job left to our srun."""
    work = copy_workflow(tmp_path / "repo", config="config/paper.yaml")
    # The site's settings in a file of their own, layered over the paper config
    # (docs/cluster.md: `--configfile config/paper.yaml site.yaml`).
    (work / "site.yaml").write_text(yaml.safe_dump({"cluster": dict(
        partition="cpu", gpu_partition="gpu", account="proj42", gpu_type="h100",
        constraint="h100|h200")}))
    _paper_inputs(work)
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name in ["sbatch", "squeue", "sinfo", "scontrol", "sacct", "scancel", "sacctmgr", "sshare"]:
        (stubs / name).write_text(STUB.format(name=name))
        (stubs / name).chmod(0o755)
    # The preflight gates the training job (marble.workflow.preflight): a doctor that passes.
    (stubs / "marble").write_text(f'#!/bin/sh\n[ "$1" = doctor ] && exit 0\nexec {BIN}/marble "$@"\n')
    (stubs / "marble").chmod(0o755)
    environ = env()
    environ.update(PATH=f"{stubs}:{environ['PATH']}", STUB_DIR=str(stubs))
    proc = subprocess.Popen(
        [str(BIN / "snakemake"), "--profile", "slurm", "results/runs/rho_07/train_summary.json",
         "--configfile", "config/paper.yaml", "site.yaml"],
        cwd=work, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while not (stubs / "sbatch.stdin").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)
    proc.kill()  # SIGTERM would wait for the (never ending) stub job
    out, _ = proc.communicate(timeout=60)
    assert (stubs / "sbatch.argv").exists(), f"sbatch never called:\n{out[-3000:]}"
    argv = (stubs / "sbatch.argv").read_text().split("\n")
    call = " ".join(argv)
    for expected in ["--nodes=2", "--ntasks=2", "--gres=gpu:h100:8", "--requeue",
                     "--signal=USR1@600", "--ntasks-per-node=1", "--mem", "480000", "2880",
                     "-A proj42", "-p gpu"]:
        assert expected in call, f"{expected} missing from: sbatch {call}"
    assert "--ntasks-per-gpu" not in call and call.count("--requeue") == 1
    assert "--exclude" not in call  # no node excluded up front (see slurm/README.md)
    assert argv[argv.index("-C") + 1] == "h100|h200"  # one argument: quoted for the shell
    # The job runs Snakemake's own jobstep for exactly this rule.
    assert "--target-jobs" in call and "train_run:run=rho_07" in call
    print("sbatch", shlex.join(argv))


STEP_STUBS = {
    # srun: records its options, then runs the task as task 0 of a 2-node step.
    "srun": """#!/usr/bin/env bash
printf '%s\\n' "$@" > "$STUB_DIR/srun.argv"
while [ "${1#--}" != "$1" ]; do shift; done
SLURM_PROCID=0 SLURM_STEP_NUM_TASKS="${STEP_TASKS:-1}" SLURM_JOB_NODELIST="$STEP_NODES" exec "$@"
""",
    "scontrol": """#!/usr/bin/env bash
[ "$1" = show ] && { tr ',' '\\n' <<<"$STEP_NODES"; exit 0; }
echo "scontrol $*" >> "$STUB_DIR/scontrol.log"
""",
    "torchrun": "#!/usr/bin/env bash\nprintf '%s\\n' \"$@\" > \"$STUB_DIR/torchrun.argv\"\n",
}


def _step_stubs(tmp_path: Path, nodes: str, tasks: int) -> dict:
    """Stub srun/scontrol/torchrun on PATH; the environment of a job with id 4242."""
    stubs = tmp_path / "step-stubs"
    stubs.mkdir()
    for name, text in STEP_STUBS.items():
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    environ = {k: v for k, v in env().items() if not k.startswith("SLURM_")}
    environ.update(PATH=f"{stubs}:{environ['PATH']}", STUB_DIR=str(stubs), STEP_NODES=nodes,
                   STEP_TASKS=str(tasks), SLURM_JOB_ID="4242")
    return environ


def _rule_shell(work: Path, target: str) -> str:
    """The training rule's shell command as Snakemake would run it (`-n -p`)."""
    out = snakemake(["-n", "-p", "--nolock", target], work).stdout
    lines = [line.strip() for line in out.splitlines() if "train_launch.sh" in line]
    assert len(lines) == 1, out[-3000:]
    return lines[0].removeprefix("Shell command:").strip()


def test_paper_training_step_launches_torchrun_on_a_per_job_port(tmp_path):
    """The paper rule's command inside job 4242 (stub srun, scontrol, torchrun): one task
    per node via srun, torchrun with 2 nodes x 8 procs, c10d on the first host, and a
    rendezvous port derived from the job id (20000 + id % 10000), not a fixed 29500."""
    work = copy_workflow(tmp_path / "repo", config="config/paper.yaml")
    _paper_inputs(work)
    shell = _rule_shell(work, "results/runs/rho_07/train_summary.json")
    assert "train_launch.sh srun --" in shell and "MARBLE_RDZV_PORT= " in shell
    environ = _step_stubs(tmp_path, "gpu01,gpu02", tasks=2)
    (work / "logs/train").mkdir(parents=True)  # Snakemake makes the log's folder
    subprocess.run(["bash", "-c", shell], cwd=work, env=environ, check=True, timeout=60)
    stubs = Path(environ["STUB_DIR"])
    srun = (stubs / "srun.argv").read_text().split()
    assert {"--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1"} <= set(srun)
    torchrun = " ".join((stubs / "torchrun.argv").read_text().split())
    print("torchrun", torchrun)
    assert "--nnodes 2 --nproc_per_node 8 --rdzv_backend c10d" in torchrun
    assert "--rdzv_endpoint gpu01:24242 --rdzv_id 4242" in torchrun
    assert "-m marble.train --preset rho_07" in torchrun
    log = (work / "results/runs/rho_07/train.log").read_text()
    assert "train_launch: " in log and "start (job 4242)" in log  # every attempt kept here


def test_one_node_job_runs_the_trainer_in_a_job_step(tmp_path):
    """`mpi=""` (one task): the launcher still starts the trainer with srun, so the
    time-limit USR1 (sent to job steps) reaches it; a set train.port is used as is."""
    environ = _step_stubs(tmp_path, "gpu07", tasks=1)
    environ.update(MARBLE_NODES="1", MARBLE_TASKS="1", MARBLE_GPUS_PER_NODE="4",
                   MARBLE_RDZV_PORT="31000")
    run_dir = tmp_path / "runs/one"
    subprocess.run(["bash", str(ROOT / "workflow/scripts/train_launch.sh"), "", "--",
                    "--preset", "tiny", "--output-dir", str(run_dir)],
                   cwd=tmp_path, env=environ, check=True, timeout=60)
    stubs = Path(environ["STUB_DIR"])
    assert {"--nodes=1", "--ntasks=1"} <= set((stubs / "srun.argv").read_text().split())
    torchrun = " ".join((stubs / "torchrun.argv").read_text().split())
    assert "--nnodes 1 --nproc_per_node 4" in torchrun and "gpu07:31000" in torchrun


def _slurm_ready() -> str | None:
    """None when a localhost SLURM is (or was just) started, else why not."""
    if os.geteuid() != 0:
        return "needs root to install and start slurm"
    proc = subprocess.run(["bash", str(SLURM_SCRIPTS / "start_slurm.sh")], capture_output=True,
                          text=True, timeout=900)
    if proc.returncode == 3:  # the script's "cannot install" status
        return f"slurm cannot be installed here: {proc.stdout[-500:]}{proc.stderr[-500:]}"
    if proc.returncode != 0:
        raise AssertionError(f"start_slurm.sh failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return None


@pytest.mark.slow
@pytest.mark.slurm
def test_tiny_pipeline_through_real_slurm(tiny_pipeline, tmp_path):
    reason = _slurm_ready()
    if reason:
        pytest.skip(reason)
    # Model and tables from the local run; SLURM runs training, evaluation and report.
    tiny_pipeline_dir = tiny_pipeline["dir"]
    work = copy_workflow(tmp_path / "repo")
    copy_inputs(tiny_pipeline_dir, work, ["data/models", "data/raw-tiny", "data/datasets"])
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["runs"] = {"marble": {"preset": "tiny", "max_steps": 2, "set": ["train.save_every=1"]}}
    cfg["train"].update(nodes=1, tasks=2, cpus_per_task=1, mem_mb=2000, runtime=20)
    cfg["eval"].update(datasets=["pickscore"], limit=2)
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    start = time.perf_counter()
    # The plugin first asks SLURM about a job 40 s after submitting it (then 10 s later each
    # time none finished): most jobs here end in seconds, and four run one after another.
    proc = snakemake(["--profile", "slurm", "all", "--jobs", "4", "--latency-wait", "5",
                      "--slurm-init-seconds-before-status-checks", "5"], work, timeout=1500)
    print(f"\n[bench] tiny DAG through localhost SLURM: {time.perf_counter() - start:.1f} s")
    summary = json.loads((work / "results/runs/marble/train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["final_step"] == 2
    log = (work / "logs/train/marble.log").read_text()
    assert "torchrun_slurm: task 0 of 2" in log and "torchrun_slurm: task 1 of 2" in log
    assert (work / "results/report/report.md").is_file()
    assert (work / "results/eval/summary.csv").is_file()
    submitted = [line for line in (proc.stdout + proc.stderr).splitlines()
                 if "has been submitted with SLURM jobid" in line]
    assert any("rule_train_run" in line for line in submitted), "training did not go through sbatch"
    assert "via srun (job " in log


def _wait(predicate, proc: subprocess.Popen, what: str, timeout: float = 900) -> None:
    deadline = time.time() + timeout  # readiness polling only; nothing is timed
    while not predicate() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert predicate(), f"never saw {what}"


def _steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    text = path.read_text() if path.is_file() else ""
    return [json.loads(line)["step"] for line in text.splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.slurm
def test_usr1_on_a_one_node_job_exits_75_requeues_and_resumes_bitwise(tiny_pipeline, tmp_path):
    """A one-node training job gets USR1 as SLURM sends it before the time limit (to the
    job's steps: `scancel --signal=USR1`, no --batch), first while the model loads, then
    after a step. Each time the trainer exits 75 and the job requeues itself (same id).
    Then `scontrol requeue` (what SLURM does on a node failure) kills the third attempt:
    the same job id restarts, takes over its own run lock, resumes from the last complete
    checkpoint, appends to the run's train.log, and the main Snakemake (slurm-requeue) sees
    the job finish. The run ends with the weights of an uninterrupted run, bit for bit."""
    reason = _slurm_ready()
    if reason:
        pytest.skip(reason)
    work = copy_workflow(tmp_path / "repo")
    copy_inputs(tiny_pipeline["dir"], work, ["data/models", "data/raw-tiny", "data/datasets"])
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    # save_every 100: only the signal's checkpoint and the final one.
    cfg["runs"] = {"marble": {"preset": "tiny", "max_steps": 4, "set": ["train.save_every=100"]}}
    cfg["train"].update(nodes=1, cpus_per_task=1, mem_mb=2000, runtime=20, requeue_signal_s=60)
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    environ = {**env(), "OMP_NUM_THREADS": "1"}  # the reference below runs with the same
    main = subprocess.Popen([str(BIN / "snakemake"), "--profile", "slurm",
                             "results/runs/marble/train_summary.json", "--latency-wait", "5"],
                            cwd=work, env=environ, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    run_dir = work / "results/runs/marble"
    lock = lock_path(run_dir)  # outside results/runs (marble.training.run_lock)
    # 1. The lock is taken before torch and the model load: signal the loading trainer.
    _wait(lock.is_file, main, "the run lock")
    job_id = json.loads(lock.read_text())["job_id"]
    subprocess.run(["scancel", "--signal=USR1", job_id], check=True, timeout=60)
    log = run_dir / "train.log"
    _wait(lambda: log.read_text().count("start (job") >= 2, main, "the requeued attempt")
    # 2. After a step of the second attempt.
    _wait(lambda: len(_steps(run_dir)) >= 1, main, "a training step")
    subprocess.run(["scancel", "--signal=USR1", job_id], check=True, timeout=60)
    # The uninterrupted reference: the same resolved config (written by every attempt once
    # its model loaded), the same thread count. It trains beside the job's requeues (each
    # waits out cred_expire, 31 s) instead of after the job: one thread each, same bits.
    ref, ref_config, ref_log = tmp_path / "ref", tmp_path / "ref-config.yaml", tmp_path / "ref.log"
    shutil.copy2(run_dir / "config.yaml", ref_config)
    with open(ref_log, "w") as sink:
        reference = subprocess.Popen([str(BIN / "marble"), "train", "--preset", "tiny", "--config",
                                      str(ref_config), "--output-dir", str(ref), "--no-progress"],
                                     cwd=work, env=environ, stdout=sink, stderr=subprocess.STDOUT)
    try:
        # 3. An external requeue of the third attempt as soon as it starts (no checkpoint of its own).
        _wait(lambda: log.read_text().count("start (job") >= 3, main, "the third attempt")
        subprocess.run(["scontrol", "requeue", job_id], check=True, timeout=60)
        out, _ = main.communicate(timeout=1200)
        reference.wait(timeout=900)
    finally:
        if reference.poll() is None:  # a failed wait above: no trainer left behind
            reference.kill()
            reference.wait()
    assert main.returncode == 0, out[-4000:]
    assert reference.returncode == 0, ref_log.read_text()[-4000:]
    assert yaml.safe_load(ref_config.read_text()) == yaml.safe_load((run_dir / "config.yaml").read_text())
    text = log.read_text()
    print(text[-3000:])
    # (searched anywhere in a line: a killed attempt can leave a progress bar unterminated)
    starts = re.findall(r"train_launch: \S+ start \(job \d+\)", text)
    assert len(starts) == 4 and all(f"(job {job_id})" in line for line in starts), text[-3000:]
    assert text.count("exit 75 (requeue)") == 2 and text.count(f"requeue job {job_id}") == 2
    assert not lock.exists()
    summary = json.loads((run_dir / "train_summary.json").read_text())
    assert summary["final_step"] == 4 and summary["resumed_from"]
    assert _steps(run_dir) == [1, 2, 3, 4]  # no step twice, none lost
    from safetensors.torch import load_file

    def final(folder):
        return load_file(str(folder / "checkpoints/checkpoint-000004/adapters.safetensors"))

    got, want = final(run_dir), final(ref)
    assert got.keys() == want.keys()
    assert all(bool((got[k] == want[k]).all()) for k in got), "resumed weights differ"


@pytest.mark.slurm
def test_doctor_names_the_training_job_the_partition_cannot_hold(tmp_path):
    """The localhost partition (one 2-CPU node, no GPUs) cannot hold the paper's 2 x 8-GPU
    training: `sbatch --test-only` with the job's own options says so, the report job fits."""
    reason = _slurm_ready()
    if reason:
        pytest.skip(reason)
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"cluster": {"partition": "debug", "gpu_partition": "debug",
                                                "account": None}}))
    proc = subprocess.run([str(BIN / "marble"), "doctor", "--configfile", "config/paper.yaml",
                           str(site)], cwd=ROOT, env=env(), capture_output=True, text=True,
                          timeout=300, check=False)
    rows = {line.split()[2]: line for line in proc.stdout.splitlines()
            if line.startswith("slurm fits")}
    assert "FAIL" in rows["train_run"] and "2 nodes" in rows["train_run"], proc.stdout[-3000:]
    assert "gres" in rows["train_run"]  # SLURM's own reason
    assert " ok " in rows["report"], proc.stdout[-3000:]
    assert proc.returncode == 1
