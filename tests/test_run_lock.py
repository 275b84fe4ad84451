"""The run lock `marble train` takes (marble.training.run_lock): atomic, owner recorded,
stale owners taken over, live ones refused with a clear error."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading

import pytest

from marble.training import run_lock
from marble.training.run_lock import RunLockError, acquire, lock_path, release


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _write(run, **owner):
    lock_path(run).parent.mkdir(parents=True, exist_ok=True)
    lock_path(run).write_text(json.dumps({"started": "then", **owner}))


def test_lock_records_pid_host_job_and_is_released(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "777")
    lock = acquire(tmp_path / "run")
    owner = json.loads(lock.read_text())
    assert (owner["pid"], owner["host"], owner["job_id"]) == (os.getpid(), socket.gethostname(), "777")
    release(lock)
    assert not lock.exists()
    assert sorted(p.name for p in lock.parent.iterdir()) == []  # no temp files left


def test_live_owner_is_refused_naming_it(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    run = tmp_path / "run"
    run.mkdir()
    _write(run, pid=os.getpid(), host=socket.gethostname(), job_id="12")  # alive: us
    with pytest.raises(RunLockError, match=rf"being trained by pid {os.getpid()} on .*SLURM job 12"):
        acquire(run)
    # An owner on another host cannot be checked from here: refused as well.
    _write(run, pid=_dead_pid(), host="elsewhere-node", job_id=None)
    with pytest.raises(RunLockError, match="on elsewhere-node"):
        acquire(run)


def test_stale_owner_is_taken_over(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    run = tmp_path / "run"
    run.mkdir()
    _write(run, pid=_dead_pid(), host=socket.gethostname(), job_id=None)  # a killed trainer
    lock = acquire(run)
    assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert "is dead on" in capsys.readouterr().out
    # A requeued SLURM job (same id, the old attempt's pid maybe on another host).
    release(lock)
    _write(run, pid=1, host="other-node", job_id="4242")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert json.loads(acquire(run).read_text())["pid"] == os.getpid()


def test_a_garbled_lock_is_an_error_not_a_takeover(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lock_path(run).parent.mkdir(parents=True)
    lock_path(run).write_text("slurm 1234 host\n")
    with pytest.raises(RunLockError, match="not a marble run lock"):
        acquire(run)


def test_only_one_of_many_concurrent_takers_wins(tmp_path, monkeypatch):
    """link() is atomic: of 8 threads racing for a fresh lock exactly one gets it (the
    others see the winner, this live process, and are refused)."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    run = tmp_path / "run"
    run.mkdir()
    results, start = [], threading.Barrier(8)

    def take():
        start.wait()
        try:
            acquire(run)
            results.append("won")
        except RunLockError:
            results.append("refused")

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["refused"] * 7 + ["won"]


def test_take_over_loses_to_a_newer_owner(tmp_path):
    """Judged stale, but replaced before we moved it: the new owner's lock is put back."""
    run = tmp_path / "run"
    run.mkdir()
    newer = {"pid": os.getpid(), "host": socket.gethostname(), "job_id": None, "started": "now"}
    _write(run, **newer)
    assert run_lock._take_over(lock_path(run), {"pid": 1, "host": "x"}) is False
    assert json.loads(lock_path(run).read_text()) == newer


def _stub_squeue(tmp_path, monkeypatch, script: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(f"#!/bin/sh\n{script}\n")
    (bin_dir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def test_an_owner_job_on_another_host_is_checked_with_squeue(tmp_path, monkeypatch):
    """A restarted Snakemake resubmits a run whose first job still runs on another node:
    refused while squeue shows that job RUNNING; taken over once SLURM forgot it."""
    monkeypatch.setenv("SLURM_JOB_ID", "2000")
    run = tmp_path / "run"
    run.mkdir()
    _write(run, pid=1, host="node-a", job_id="1999")
    _stub_squeue(tmp_path, monkeypatch, 'echo RUNNING')
    with pytest.raises(RunLockError, match="SLURM job 1999"):
        acquire(run)
    (tmp_path / "bin/squeue").write_text(
        "#!/bin/sh\necho 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1\n")
    assert json.loads(acquire(run).read_text())["job_id"] == "2000"


def test_the_lock_lives_outside_the_run_folder_where_dvc_cannot_remove_it(tmp_path, monkeypatch):
    """`dvc checkout --force` replaces results/runs whole; the lock (and so the live
    trainer's claim) lives under <project>/.marble/locks, which no DVC output holds."""
    import shutil

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    run = tmp_path / "results" / "runs" / "tiny"
    run.mkdir(parents=True)
    lock = acquire(run)
    assert lock == tmp_path / ".marble" / "locks" / "results" / "runs" / "tiny" / "TRAINING.lock"
    shutil.rmtree(tmp_path / "results")  # what dvc checkout --force does to the output folder
    with pytest.raises(RunLockError, match="being trained by"):
        acquire(run)
    release(lock)
    monkeypatch.chdir(tmp_path / ".marble")  # the project root, not the working folder, decides
    assert acquire(tmp_path / "results" / "runs" / "tiny") == lock
