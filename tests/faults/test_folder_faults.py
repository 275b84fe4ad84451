"""Fault: the run folder loses files under a running trainer (issue 38).

`dvc checkout --force train` while `marble train` runs deletes what the `persist: true` output
holds and its cache lacks: config.yaml, inputs.json, the logs, the checkpoints. The trainer
used to finish with exit 0, leaving a folder without its identity that a later resume with
another config adopted. Here a real `marble train` process has its folder emptied after its
second checkpoint: it must stop non-zero with one line naming what went, leave the folder
whole again (identity files, logs, the checkpoint of the step it stopped at), and the same
command must then finish the run bitwise as an uninterrupted one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from checkpoint_compare import assert_same_checkpoint
from test_resume import ROOT, args, table_path  # noqa: F401  (table_path: a fixture)

from marble.train import main as train_main
from marble.training.checkpoint import checkpoint_dir

STEPS = 4


def start_training(model: Path, table: Path, run: Path) -> subprocess.Popen:
    # The same intra-op thread count as this process: CPU float sums depend on it.
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads()),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "marble.train", *args(model, table, run, STEPS)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{path} never appeared (exit {proc.poll()}): {proc.communicate()[1][-2000:]}")
        time.sleep(0.05)


@pytest.mark.fault("run folder emptied under a running trainer (dvc checkout --force)")
def test_files_deleted_under_a_running_trainer_stop_it_non_zero_and_the_rerun_finishes_bitwise(
        tiny_model_dir, table_path, tmp_path, fault_trials):
    straight = tmp_path / "straight"
    assert train_main(args(tiny_model_dir, table_path, straight, STEPS)) == 0
    run = tmp_path / "run"
    proc = start_training(tiny_model_dir, table_path, run)
    wait_for(checkpoint_dir(run, 2) / "COMPLETE", proc)
    # What a forced checkout of an output its cache does not hold leaves: nothing of the run.
    for name in ("config.yaml", "inputs.json", "metrics.jsonl"):
        (run / name).unlink()
    shutil.rmtree(run / "checkpoints")
    _, err = proc.communicate(timeout=600)
    lines = [x for x in err.splitlines() if x.startswith("marble train")]
    fault_trials.record(proc.returncode == 2, f"the trainer's exit: {proc.returncode} (2 expected)")
    fault_trials.record(len(lines) == 1 and "deleted under the running trainer" in lines[0]
                        and "config.yaml" in lines[0] and "Traceback" not in err, f"its message: {lines}")
    left = sorted(p.name for p in run.iterdir())
    fault_trials.record({"config.yaml", "inputs.json", "metrics.jsonl", "checkpoints"} <= set(left),
                        f"the folder it left: {left}")
    assert train_main(args(tiny_model_dir, table_path, run, STEPS)) == 0  # the same command resumes
    assert_same_checkpoint(checkpoint_dir(straight, STEPS), checkpoint_dir(run, STEPS))
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines() if line]
    fault_trials.record(steps == list(range(1, STEPS + 1)), f"metrics.jsonl steps {steps}")
    assert not fault_trials.lost, fault_trials.lost
