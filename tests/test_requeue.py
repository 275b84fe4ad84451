"""Stop requests (marble.training.stopping) and the SLURM wrapper's requeue, without SLURM.

The wrapper runs with stand-in `torchrun` and `scontrol` on PATH: the fake torchrun
starts one fake worker (a python process with marble's stop contract: flag the signal,
write $MARBLE_REQUEUE_FILE, exit 75) and, like torchrun, exits 1 when a worker fails.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

from marble.runtime import distributed as dist
from marble.training.stopping import (
    EXIT_REQUEUE,
    MAX_STALLED_ATTEMPTS,
    REQUEUE_FILE_ENV,
    StopRequest,
    stall_reason,
    stalled_attempts,
    write_requeue_file,
)

ROOT = Path(__file__).resolve().parents[1]
WRAPPER = ROOT / "workflow" / "scripts" / "torchrun_slurm.sh"


def test_stop_request_flags_the_signal_and_restores_handlers(monkeypatch, tmp_path):
    before = signal.getsignal(signal.SIGUSR1)
    with StopRequest() as stop:
        assert not stop.requested and not stop.agreed()
        os.kill(os.getpid(), signal.SIGUSR1)  # would end the process without the handler
        assert stop.requested and stop.signal_name == "SIGUSR1" and not stop.cancelled
        # A TERM after the time-limit warning is a cancel: it wins (no requeue follows).
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.signal_name == "SIGTERM" and stop.cancelled
        assert stop.agreed()  # one process: its own flag
    assert signal.getsignal(signal.SIGUSR1) == before
    monkeypatch.delenv(REQUEUE_FILE_ENV, raising=False)
    assert write_requeue_file(3, "SIGUSR1", True) is None
    monkeypatch.setenv(REQUEUE_FILE_ENV, str(tmp_path / "requeue"))
    assert write_requeue_file(3, "SIGUSR1", True).read_text() == "step 3 SIGUSR1 with a checkpoint\n"
    assert write_requeue_file(0, "SIGUSR1", False).read_text() == "step 0 SIGUSR1 without a checkpoint\n"


def test_attempts_that_requeue_without_a_step_are_bounded(tmp_path):
    """A time limit shorter than one step after the warning requeued forever (4 attempts in
    4.5 min, no step): attempts in a row without a step are counted per job id, and the
    MAX_STALLED_ATTEMPTS-th stops the run with a reason; a step resets the count, and a
    job submitted anew starts from zero."""
    state = tmp_path / "locks" / "STALLS.json"
    counts = [stalled_attempts(state, "41", progressed=False) for _ in range(MAX_STALLED_ATTEMPTS)]
    assert counts == list(range(1, MAX_STALLED_ATTEMPTS + 1))
    assert stall_reason(counts[-2], 0) is None
    reason = stall_reason(counts[-1], 0)
    assert "before finishing a step" in reason and "train.runtime" in reason and "requeue_signal_s" in reason
    assert stalled_attempts(state, "42", progressed=False) == 1  # a new job: counted anew
    assert stalled_attempts(state, "42", progressed=True) == 0
    assert stalled_attempts(state, "42", progressed=False) == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _agree_worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
                      RANK=str(rank), LOCAL_RANK=str(rank))
    dist.init_distributed("cpu")
    stop = StopRequest()
    first = stop.agreed()  # nobody signalled
    if rank == 1:
        stop.signum = signal.SIGUSR1  # the signal reached rank 1 only
    second = (stop.agreed(), stop.cancelled)
    if rank == 0:
        stop._handle(signal.SIGTERM, None)  # a cancel that reached rank 0 only
    third = (stop.agreed(), stop.cancelled)
    torch.save({"first": first, "second": second, "third": third}, os.path.join(out_dir, f"r{rank}.pt"))
    dist.cleanup()


def test_all_ranks_agree_to_stop_when_one_is_signalled(tmp_path):
    mp.spawn(_agree_worker, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        out = torch.load(tmp_path / f"r{rank}.pt", weights_only=True)
        # every rank stops after a USR1 anywhere, and none requeues after a TERM anywhere
        assert out == {"first": False, "second": (True, False), "third": (True, True)}, rank


# ------------------------------------------------------------------ the SLURM wrapper

FAKE_WORKER = """
import os, signal, sys, time
mode, log = sys.argv[1], sys.argv[2]
flag = []
signal.signal(signal.SIGUSR1, lambda s, f: flag.append(s))
# As the trainer before issue 48: a TERM also wrote the requeue file and exited 75.
signal.signal(signal.SIGTERM, lambda s, f: flag.append(s))
open(log + ".ready", "w").close()
if mode == "fail":
    sys.exit(3)
while not flag:
    time.sleep(0.02)
with open(os.environ["MARBLE_REQUEUE_FILE"], "w") as fh:
    fh.write("step 7 SIGUSR1\\n")
with open(log, "a") as fh:
    fh.write("worker got %d\\n" % flag[0])
sys.exit(75)
"""

FAKE_TORCHRUN = """#!/usr/bin/env bash
# Like torchrun: workers are children; any failed worker makes the agent exit 1.
echo "torchrun $*" >> "$FAKE_LOG"
while [ -e "$FAKE_DIR/hold" ]; do sleep 0.05; done  # a worker not started yet
{python} "$FAKE_DIR/worker.py" "$FAKE_MODE" "$FAKE_LOG" &
wait $!
rc=$?
echo "torchrun saw worker exit $rc" >> "$FAKE_LOG"
[ "$rc" = 0 ] || exit 1
"""

FAKE_SCONTROL = """#!/usr/bin/env bash
if [ "$1" = show ]; then echo localhost; exit 0; fi
echo "scontrol $*" >> "$FAKE_LOG"
"""


def _fake_cluster(tmp_path: Path, mode: str) -> tuple[dict, Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "worker.py").write_text(FAKE_WORKER)
    for name, text in (("torchrun", FAKE_TORCHRUN.format(python=sys.executable)),
                       ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242",
           "SLURM_PROCID": "0", "SLURM_JOB_NODELIST": "localhost", "TMPDIR": str(tmp_path),
           "FAKE_LOG": str(log), "FAKE_DIR": str(tmp_path), "FAKE_MODE": mode}
    return env, log


def _wait_for(path: Path, proc: subprocess.Popen) -> None:
    for _ in range(1500):  # polling for readiness only; no timing is asserted
        if path.exists() or proc.poll() is not None:
            return
        time.sleep(0.02)


def test_wrapper_turns_usr1_into_checkpoint_exit_and_requeue(tmp_path):
    env, log = _fake_cluster(tmp_path, "train")
    proc = subprocess.Popen(["bash", str(WRAPPER), "--preset", "tiny"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait_for(Path(str(log) + ".ready"), proc)
    proc.send_signal(signal.SIGUSR1)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    lines = log.read_text().splitlines()
    assert f"worker got {int(signal.SIGUSR1)}" in lines  # forwarded to the worker
    assert "torchrun saw worker exit 75" in lines  # torchrun itself survived USR1
    assert lines[-1] == "scontrol requeue 4242"
    assert "step 7 SIGUSR1" in out and "requeue job 4242" in out
    assert not list(tmp_path.glob("marble-requeue.*"))  # the flag file is cleaned up


def test_wrapper_never_requeues_after_a_term(tmp_path):
    """scancel (or an admin, or Snakemake's Ctrl-C) sends TERM: the workers are asked to
    checkpoint and stop, and even a worker that then asks for a requeue (status 75 and the
    flag file, as the trainer did) is not requeued: a cancelled job stays cancelled."""
    env, log = _fake_cluster(tmp_path, "train")
    proc = subprocess.Popen(["bash", str(WRAPPER), "--preset", "tiny"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait_for(Path(str(log) + ".ready"), proc)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    lines = log.read_text().splitlines()
    assert f"worker got {int(signal.SIGTERM)}" in lines  # forwarded: the step checkpoints
    assert not any(line.startswith("scontrol requeue") for line in lines), lines
    assert "not requeued" in out and proc.returncode != 0, out
    assert not list(tmp_path.glob("marble-requeue.*"))


def test_a_usr1_before_the_workers_exist_still_stops_them(tmp_path):
    """SLURM may send USR1 up to a minute early, before torchrun has started its workers: the
    wrapper keeps it pending and sends it again until they stop (it used to be lost, and the
    job ran into its hard limit)."""
    env, log = _fake_cluster(tmp_path, "train")
    (tmp_path / "hold").touch()
    proc = subprocess.Popen(["bash", str(WRAPPER), "--preset", "tiny"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(log, proc)  # torchrun runs; its worker does not exist yet
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.5)  # lets the wrapper handle it while no worker exists (not a timing assertion)
        (tmp_path / "hold").unlink()
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    lines = log.read_text().splitlines()
    assert f"worker got {int(signal.SIGUSR1)}" in lines and lines[-1] == "scontrol requeue 4242"


def test_wrapper_does_not_requeue_a_failed_run(tmp_path):
    env, log = _fake_cluster(tmp_path, "fail")
    proc = subprocess.run(["bash", str(WRAPPER), "--preset", "tiny"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "scontrol requeue" not in log.read_text()
    assert EXIT_REQUEUE == 75  # the documented status (README, workflow/scripts)
