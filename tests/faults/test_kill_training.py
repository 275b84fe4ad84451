"""Fault: kill -9 of a tiny training run at seeded random moments (issue 21, item 7).

An uninterrupted 4-step run (checkpoint every step, every I/O and compute event counted)
is the reference. Each trial starts the same run in a subprocess, SIGKILLs it at a drawn
event (before a write, or with the write half done), reruns it to the end and compares:
every checkpoint file bitwise (adapters, optimizer, state and the EMA `lora/`: bytes, or
for safetensors each tensor's bytes and the metadata), the metrics log step by step (each
step once), no stale temporary folders.

MARBLE_FAULT_SEED (default 21) draws the moments, MARBLE_FAULT_KILLS (default 3) how many.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from test_resume import ROOT, args, table_path  # noqa: F401  (table_path: a fixture)

from marble.runtime.fingerprint import fingerprint
from marble.train import main as train_main
from marble.training.checkpoint_format import (
    damaged_files,
    file_hashes,
    list_checkpoints,
    sha256_file,
)

from .killer import count_events

pytestmark = pytest.mark.fault("kill -9 during training (bitwise vs uninterrupted)")
STEPS = 4
SEED = int(os.environ.get("MARBLE_FAULT_SEED", "21"))
KILLS = int(os.environ.get("MARBLE_FAULT_KILLS", "3"))


def run_args(model: Path, table: Path, run: Path) -> list[str]:
    return args(model, table, run, STEPS, "train.keep_checkpoints=0")


def file_content(path: Path):
    """What a file holds, bit for bit: a safetensors file as its header metadata and each
    tensor's bytes (safetensors writes the metadata map in hash order, so two identical
    saves can differ in bytes), any other file as its sha256."""
    if path.suffix != ".safetensors":
        return sha256_file(path)
    with safe_open(str(path), "pt") as fh:
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}
        meta = fh.metadata()
    return meta, {k: (str(t.dtype), tuple(t.shape), t.numpy().tobytes()) for k, t in tensors.items()}


def checkpoint_contents(run: Path) -> dict[str, dict]:
    """{checkpoint name: {file: content}} of every checkpoint folder of a run (weights,
    optimizer, state and the EMA `lora/`)."""
    return {path.name: {rel: file_content(path / rel) for rel in file_hashes(path)}
            for _, path in list_checkpoints(run)}


def metric_rows(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


@pytest.fixture(scope="module")
def reference(tiny_model_dir, table_path, tmp_path_factory):
    run = tmp_path_factory.mktemp("reference") / "run"
    # The inputs' digests in the hash cache first: a cold cache's writes (tens of os.replace and
    # fsync events) are the reference's alone, so a moment drawn among its last events lay past
    # the end of every killed run, which found the cache warm (and ended "not killed").
    for path in (tiny_model_dir, table_path):
        fingerprint(path)
    events, names = count_events("train", run_args(tiny_model_dir, table_path, run))
    return {"run": run, "events": events, "names": names,
            "contents": checkpoint_contents(run), "metrics": metric_rows(run)}


def kill_at(model: Path, table: Path, run: Path, event: int, mode: str) -> int:
    # The same intra-op thread count as this process: CPU float sums depend on it.
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads()),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "tests.faults.killer", str(event), mode, "train",
           *run_args(model, table, run)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return proc.returncode


def draws(reference) -> list[tuple[int, str]]:
    """Seeded moments: one inside the first checkpoint save, the rest anywhere."""
    rng = random.Random(SEED)
    first_save = [i for i, n in enumerate(reference["names"], 1) if "state.pt" in n][:1]
    first = ([rng.randint(first_save[0] - 3, first_save[0] + 3)] if first_save else [])
    rest = rng.sample(range(1, reference["events"] + 1), max(0, KILLS - len(first)))
    return [(e, rng.choice(["before", "torn"])) for e in first + rest][:KILLS]


def test_kill_minus_9_then_rerun_equals_the_uninterrupted_run(
        reference, tiny_model_dir, table_path, tmp_path, fault_trials):
    for i, (event, mode) in enumerate(draws(reference)):
        run = tmp_path / f"kill{i}" / "run"
        what = f"event {event}/{reference['events']} {mode} ({reference['names'][event - 1]})"
        code = kill_at(tiny_model_dir, table_path, run, event, mode)
        problems = [] if code == -9 else [f"not killed (exit {code})"]
        try:
            if train_main(run_args(tiny_model_dir, table_path, run)) != 0:
                problems.append("the rerun failed")
        except SystemExit as exc:  # a run no rerun can finish
            problems.append(f"the rerun exited {exc.code}")
        contents = checkpoint_contents(run)
        for name, ref in reference["contents"].items():
            got = contents.get(name, {})
            differ = sorted(f for f in set(ref) | set(got) if got.get(f) != ref.get(f))
            if differ:
                problems.append(f"{name}: {', '.join(differ)} differ from the uninterrupted run")
        problems += [f"{p.name} damaged" for _, p in list_checkpoints(run) if damaged_files(p)]
        if metric_rows(run) != reference["metrics"]:
            problems.append("metrics.jsonl differs (steps: "
                            f"{[r['step'] for r in metric_rows(run)]})")
        stale = [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]
        problems += [f"stale {name}" for name in stale]
        fault_trials.record(not problems, f"{what}: {'; '.join(problems) or 'held'}")
    assert not fault_trials.lost, fault_trials.lost
