"""How a SLURM training job stops, on the localhost SLURM (slurm/train.sbatch, the tiny model):
`scancel` leaves it cancelled (the trainer checkpoints, nothing requeues it), and a job that
keeps requeueing without a step stops for good with the reason. The time-limit USR1 that does
requeue and resume bitwise is test_slurm.py's test_usr1_on_a_one_node_job_..."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from test_sbatch import _cpu_job
from test_workflow_lib import ROOT, env

from marble.training.run_lock import lock_path
from marble.training.stopping import EXIT_CANCELLED, MAX_STALLED_ATTEMPTS, STALL_FILE

BUSY = ("RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED")


def _submit(script: Path, run: Path, log: Path, sets: list[str], *extra: str) -> str:
    """The job id of the tiny training submitted with `extra` sbatch options (no --wait)."""
    proc = subprocess.run(
        ["sbatch", "--parsable", "--nodes=1", "--cpus-per-task=1", "--mem=2000", "--time=20", *extra,
         f"--output={log}", str(script), "--preset", "tiny", "--output-dir", str(run), "--no-progress",
         "--max-steps", "1000000", "--set", "train.save_every=1000",
         *[x for s in sets for x in ("--set", s)]],
        cwd=ROOT, env={**env(), "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=120, check=True)
    return proc.stdout.strip().split(";")[0]


def _job(job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True,
                         timeout=60).stdout
    return dict(t.split("=", 1) for t in out.split() if "=" in t)


def _until(predicate, what: str, timeout: float = 600) -> None:
    deadline = time.time() + timeout  # readiness polling only; nothing is timed
    while not predicate():
        assert time.time() < deadline, f"never saw {what}"
        time.sleep(0.3)


def _settled(job_id: str) -> dict[str, str]:
    """The job's fields once its processes are gone (a requeue, had one come, came before)."""
    _until(lambda: _job(job_id).get("JobState") not in BUSY, f"job {job_id} ending")
    return _job(job_id)


@pytest.mark.slow
@pytest.mark.slurm
def test_scancel_of_a_running_training_leaves_it_cancelled(tiny_model_dir, tmp_path):
    """scancel after a step: the trainer checkpoints that step and exits 143; no `scontrol
    requeue` follows (it used to: TERM was taken as preemption, and the job came back)."""
    script, run, log, sets = _cpu_job(tiny_model_dir, tmp_path)
    job_id = _submit(script, run, log, sets)
    try:
        metrics = run / "metrics.jsonl"
        _until(lambda: metrics.is_file() and metrics.read_text().strip()
               or _job(job_id).get("JobState") not in ("PENDING", *BUSY), "a training step")
        subprocess.run(["scancel", job_id], check=True, timeout=60)
        fields = _settled(job_id)
    finally:
        subprocess.run(["scancel", job_id], check=False, timeout=60)
    text = log.read_text()
    assert fields["JobState"] == "CANCELLED" and fields["Restarts"] == "0", (fields, text[-3000:])
    stopped = re.search(rf"SIGTERM: stopped after step (\d+) with a checkpoint; exit {EXIT_CANCELLED}", text)
    assert stopped, text[-3000:]
    assert (run / "checkpoints" / f"checkpoint-{int(stopped.group(1)):06d}").is_dir()
    assert "not requeued" in text and "requeue job" not in text and "attempt 2" not in text


@pytest.mark.slow
@pytest.mark.slurm
def test_a_job_that_requeues_without_a_step_stops_for_good(tiny_model_dir, tmp_path):
    """The last allowed attempt of a requeue storm, on the real SLURM: the job has already
    stopped MAX_STALLED_ATTEMPTS - 1 times without a step (the count the trainer keeps beside
    its lock, seeded while the job is held, instead of minutes of real requeues); a USR1 while
    the model loads stops this attempt without a step too, and the job ends FAILED, not
    requeued, its log saying why and never "with a checkpoint"."""
    script, run, log, sets = _cpu_job(tiny_model_dir, tmp_path)
    job_id = _submit(script, run, log, sets, "--hold")
    try:
        state = lock_path(run, STALL_FILE)
        state.parent.mkdir(parents=True, exist_ok=True)
        state.write_text(json.dumps({"job_id": job_id, "stalled": MAX_STALLED_ATTEMPTS - 1}))
        subprocess.run(["scontrol", "release", job_id], check=True, timeout=60)
        _until(lock_path(run).is_file, "the run lock (the trainer loading)")
        subprocess.run(["scancel", "--signal=USR1", job_id], check=True, timeout=60)
        fields = _settled(job_id)
    finally:
        subprocess.run(["scancel", job_id], check=False, timeout=60)
    text = log.read_text()
    assert fields["JobState"] == "FAILED" and fields["Restarts"] == "0", (fields, text[-3000:])
    assert f"{MAX_STALLED_ATTEMPTS} attempts in a row stopped for a requeue before finishing a step" in text
    assert "not requeued" in text and "requeue job" not in text
    assert "with a checkpoint" not in text, text[-3000:]
