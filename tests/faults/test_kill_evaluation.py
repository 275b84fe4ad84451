"""Fault: kill -9 of a tiny evaluation at seeded random moments (issue 21, item 7).

The uninterrupted evaluation (6 samples in batches of 2, images saved) is the reference;
each trial SIGKILLs the same evaluation at a drawn write (before it, or half done),
reruns it and compares: every image bitwise, every result row (scores to the scorers'
float32 rounding, SCORE_RTOL), and average_scores.json. MARBLE_FAULT_SEED draws the
moments, MARBLE_FAULT_KILLS how many.
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
from test_evaluate import TOY, pixels, raw_dir, rows, same_scores  # noqa: F401  (raw_dir: a fixture)
from test_resume import ROOT

from marble import evaluate

from .killer import count_events

pytestmark = pytest.mark.fault("kill -9 during evaluation (vs uninterrupted)")
SEED = int(os.environ.get("MARBLE_FAULT_SEED", "21"))
KILLS = int(os.environ.get("MARBLE_FAULT_KILLS", "3"))


def eval_args(model: Path, raw: Path, out: Path) -> list[str]:
    return ["--model_path", str(model), "--dataset", "pickscore", "--data_dir", str(raw),
            "--output_dir", str(out), "--resolution", "64", "--num_inference_steps", "3",
            "--batch_size", "2", "--limit", "6", "--rewards", TOY, "--save_images"]


def outcome(out: Path) -> dict:
    """What an evaluation leaves; `debris` lists leftovers of interrupted writes."""
    debris = sorted(p.name for d in (out, out / "images") for p in d.iterdir()
                    if p.name.startswith("."))
    if debris:
        return {"debris": debris}
    return {"rows": {r["sample_id"]: r for r in rows(out)},
            "averages": json.loads((out / "average_scores.json").read_text()),
            "pixels": pixels(out)}


@pytest.fixture(scope="module")
def reference(tiny_model_dir, raw_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("eval-reference") / "out"
    events, names = count_events("evaluate", eval_args(tiny_model_dir, raw_dir, out))
    return {"events": events, "names": names, **outcome(out)}


def _portable(row: dict) -> dict:
    """A result row without what names its output folder (the image's absolute path)."""
    return {**row, "image_path": Path(row.get("image_path") or "").name}


def differences(ref: dict, got: dict) -> list[str]:
    if "debris" in got:
        return [f"left {', '.join(got['debris'])}"]
    bad = []
    if ref["rows"].keys() != got["rows"].keys():
        bad.append(f"samples {sorted(got['rows'])} != {sorted(ref['rows'])}")
    for sid in ref["rows"].keys() & got["rows"].keys():
        a, b = (_portable(x["rows"][sid]) for x in (ref, got))
        if not same_scores(a, b):
            bad.append(f"row of sample {sid} differs")
    if not same_scores(ref["averages"], got["averages"]):
        bad.append("average_scores.json differs")
    if ref["pixels"].keys() != got["pixels"].keys():
        bad.append(f"images {sorted(got['pixels'])} != {sorted(ref['pixels'])}")
    bad += [f"image {name} differs" for name in ref["pixels"].keys() & got["pixels"].keys()
            if not (ref["pixels"][name] == got["pixels"][name]).all()]
    return bad


def test_kill_minus_9_then_rerun_equals_the_uninterrupted_evaluation(
        reference, tiny_model_dir, raw_dir, tmp_path, fault_trials):
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads()),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    rng = random.Random(SEED + 1)
    for i, event in enumerate(rng.sample(range(1, reference["events"] + 1), KILLS)):
        mode = rng.choice(["before", "torn"])
        out = tmp_path / f"kill{i}"
        args = eval_args(tiny_model_dir, raw_dir, out)
        what = f"event {event}/{reference['events']} {mode} ({reference['names'][event - 1]})"
        proc = subprocess.run([sys.executable, "-m", "tests.faults.killer", str(event), mode,
                               "evaluate", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=600)
        problems = [] if proc.returncode == -9 else [f"not killed (exit {proc.returncode})"]
        code = evaluate.main(args)
        if code != 0:
            problems.append(f"the rerun exited {code}")
        else:
            problems += differences(reference, outcome(out))
        fault_trials.record(not problems, f"{what}: {'; '.join(problems) or 'held'}")
    assert not fault_trials.lost, fault_trials.lost
