"""UnifiedReward's judge as a managed sidecar: start it, wait until it answers, run the job, stop it.

    python -m marble.rewards.service --server 'CMD ... --port {port} --model-path {model}' \
        --model DIR [--ready-timeout 1800] -- marble evaluate ...

The workflow wraps each evaluation that scores `unifiedreward` in this (eval.unifiedreward:
marble.workflow.evaluation.service_prefix), so no manual step and no fixed port: the server
gets a free loopback port, is health-checked (`GET /health`, then `GET /v1/models`) before the
job starts, and its address reaches the client as $MARBLE_UNIFIEDREWARD_URL. The server runs
in its own process group (its own environment: the command may be `conda run -n ENV ...`)
and is stopped (SIGTERM, then SIGKILL) when the job ends, fails or is signalled. The same
mechanism starts paper-mini's fake judge (beds.fake_sglang).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from marble.rewards.unifiedreward import BASE_URL_ENV

HEALTH_PATHS = ("/health", "/v1/models")
STOP_GRACE_S = 30.0


class ServiceError(RuntimeError):
    """The judge did not come up (exited, or not healthy within the timeout)."""


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (the OS picks; released just before the server binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_argv(template: str, port: int, model: str | None) -> list[str]:
    """The server command: `template` with {port} and {model} filled, split like a shell would
    (the values are substituted after splitting, so a model path with spaces stays one word)."""
    words = shlex.split(template)
    if not any("{port}" in w for w in words):
        raise ServiceError(f"server command {template!r} has no {{port}}: the port is chosen per job")
    if model is None and any("{model}" in w for w in words):
        raise ServiceError(f"server command {template!r} names {{model}} but no --model was given")
    return [w.replace("{port}", str(port)).replace("{model}", model or "") for w in words]


def healthy(base: str, timeout_s: float = 5.0) -> bool:
    for path in HEALTH_PATHS:
        try:
            with urllib.request.urlopen(base + path, timeout=timeout_s) as resp:
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            continue
    return False


def wait_ready(proc: subprocess.Popen, base: str, timeout_s: float, poll_s: float = 1.0) -> float:
    """Seconds until `base` answers; ServiceError when the server exits or the time runs out."""
    start = time.monotonic()
    while True:
        if proc.poll() is not None:
            raise ServiceError(f"the UnifiedReward server exited with code {proc.returncode} before it was ready")
        if healthy(base):
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise ServiceError(f"the UnifiedReward server at {base} was not healthy after {timeout_s:.0f}s")
        time.sleep(poll_s)


def stop(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the server's process group, SIGKILL what is left after `grace_s`."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def run_with_server(template: str, model: str | None, job: list[str], ready_timeout_s: float) -> int:
    """Start the judge, run `job` with its URL in the environment, stop the judge; job's exit code."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    argv = server_argv(template, port, model)
    print(f"marble.rewards.service: starting {shlex.join(argv)}", flush=True)
    proc = subprocess.Popen(argv, start_new_session=True)  # own group: stopped as a whole

    def on_signal(signum, _frame):  # SLURM's SIGTERM/USR1: stop the judge with the job
        raise SystemExit(128 + signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        waited = wait_ready(proc, base, ready_timeout_s)
        print(f"marble.rewards.service: ready at {base}/v1 after {waited:.1f}s", flush=True)
        env = {**os.environ, BASE_URL_ENV: f"{base}/v1"}
        return subprocess.call(job, env=env)
    finally:
        stop(proc)
        for s, handler in previous.items():
            signal.signal(s, handler)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("marble.rewards.service: expected `-- JOB ...` after the options", file=sys.stderr)
        return 2
    split = argv.index("--")
    p = argparse.ArgumentParser(prog="python -m marble.rewards.service", description=__doc__.split("\n\n")[0])
    p.add_argument("--server", required=True, help="server command with {port} (and {model})")
    p.add_argument("--model", default=None, help="the judge's weights folder ({model})")
    p.add_argument("--ready-timeout", type=float, default=1800.0, help="seconds to wait for /health")
    args = p.parse_args(argv[:split])
    job = argv[split + 1:]
    if not job:
        p.error("no job after `--`")
    try:
        return run_with_server(args.server, args.model, job, args.ready_timeout)
    except ServiceError as exc:
        print(f"marble.rewards.service: {exc}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    raise SystemExit(main())
