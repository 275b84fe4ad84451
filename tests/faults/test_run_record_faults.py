"""Issue 49 (2, 3) on the tiny SD3, one step a training:

- a reward that is not a finite number is unscorable whatever the sign: +inf on some samples is
  counted in `reward_nan` (it was averaged in as a reward of inf beside `reward_nan 0`), -inf on
  every sample fails the run like NaN (it trained to "done" with `-Infinity` in
  train_summary.json); every JSON file the run writes is strict;
- a resume checks the record it extends: metrics.jsonl deleted, a step missing or logged again
  with other values refuses (exit 2, file and line named); a line repeated alike is removed,
  saying so (a resume kept `[1, 1, 2, 3]`, or only the new step of a deleted file)."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch

from marble.data.records import PromptRecord, to_frame
from marble.rewards.toy import ToyBrightness
from marble.runtime.io import append_jsonl, write_json
from marble.train import main as train_main
from marble.training.metrics import reward_stats


def strict_load(text: str):
    """json.loads that refuses NaN/Infinity (what a strict reader, jq or JavaScript, does):
    None for text that is not strict JSON."""
    def refuse(name):
        raise ValueError(f"not strict JSON: {name}")
    try:
        return json.loads(text, parse_constant=refuse)
    except ValueError:
        return None


@pytest.fixture
def tiny_inputs(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("MARBLE_HASH_CACHE", str(tmp_path / "hashes.json"))
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    rows = [PromptRecord.make("a castle at dawn", "pickscore"), PromptRecord.make("a red apple", "pickscore"),
            PromptRecord.make("a blue car", "pickscore")]
    table = tmp_path / "train.parquet"
    to_frame(rows, {"toy_brightness": [True] * 3, "toy_saturation": [True] * 3}).to_parquet(table)
    return model, table


def train(model, table, out, steps: int) -> int:
    sets = [f"model.path={model}", f"data.train={table}", "sampling.num_steps=2",
            "sampling.resolution=32", "sampling.images_per_prompt=2", "sampling.batch_size=6",
            "sampling.num_batches_per_epoch=1", "train.batch_size=6", "train.save_every=1",
            "rewards=[{name: toy_brightness}, {name: toy_saturation}]"]
    argv = ["--preset", "tiny", "--output-dir", str(out), "--no-progress", "--max-steps", str(steps),
            *[x for s in sets for x in ("--set", s)]]
    try:
        train_main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def marble_lines(capsys) -> list[str]:
    return [x for x in capsys.readouterr().err.splitlines() if x.startswith("marble ")]


@pytest.mark.fault("reward +-inf (some samples; every sample): unscorable, counted, strict JSON")
def test_infinite_rewards_are_unscorable_and_every_json_is_strict(tiny_inputs, tmp_path, capsys,
                                                                   monkeypatch, fault_trials):
    model, table = tiny_inputs
    # The one writer: non-finite values (Python's, numpy's, nested) are null, never NaN/Infinity.
    try:
        write_json(tmp_path / "x.json", {"a": float("-inf"), "b": [float("nan"), np.float32("inf")], "c": 1.5})
        append_jsonl(tmp_path / "x.jsonl", {"step": 1, "r": float("inf")})
        written = (strict_load((tmp_path / "x.json").read_text()), strict_load((tmp_path / "x.jsonl").read_text()))
    except TypeError as exc:  # numpy's float32 was no JSON number at all
        written = (str(exc), None)
    fault_trials.record(written == ({"a": None, "b": [None, None], "c": 1.5}, {"step": 1, "r": None}),
                        f"write_json / append_jsonl of NaN and +-inf: {written}")
    stats = reward_stats("r", torch.tensor([1.0, math.inf, -math.inf, math.nan]), torch.ones(4, dtype=torch.bool))
    fault_trials.record(stats == {"reward/r": 1.0, "reward_applicable/r": 4, "reward_nan/r": 3},
                        f"reward_stats counts +-inf as unscored: {stats}")

    # +inf on every other sample: the run trains, the infs counted, nothing non-finite written.
    def half_inf(self, images, prompts, metadata):
        return torch.tensor([math.inf if i % 2 else 0.5 for i in range(len(images))])
    run = tmp_path / "half"
    with monkeypatch.context() as patch:
        patch.setattr(ToyBrightness, "score", half_inf)
        code = train(model, table, run, 1)
    record = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    texts = {p.name: p.read_text() for p in run.rglob("*.json")}
    strict = all(strict_load(t) is not None for t in texts.values())
    fault_trials.record(code == 0 and record["reward_nan/toy_brightness"] == 3
                        and record["reward/toy_brightness"] == 0.5 and strict,
                        f"+inf on half the samples: exit {code}, reward_nan "
                        f"{record['reward_nan/toy_brightness']}, every json strict: {strict}")

    # -inf on every sample: unscorable, so the run fails as a NaN reward does (exit 2, no summary).
    for value in (-math.inf, math.inf):
        run = tmp_path / f"all{value}"
        with monkeypatch.context() as patch:
            patch.setattr(ToyBrightness, "score", lambda self, images, prompts, metadata, v=value:
                          torch.full((len(images),), v))
            code = train(model, table, run, 1)
        lines = marble_lines(capsys)
        fault_trials.record(code == 2 and not (run / "train_summary.json").exists() and len(lines) == 1
                            and "toy_brightness" in lines[0] and "NaN on every logged step" in lines[0],
                            f"reward {value} on every sample: exit {code}, {lines}")
    assert not fault_trials.lost, fault_trials.lost


def steps_of(run) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.fault("metrics.jsonl deleted / cut / a step repeated, then resumed")
def test_a_resume_checks_the_record_it_extends(tiny_inputs, tmp_path, capsys, fault_trials):
    model, table = tiny_inputs
    base = tmp_path / "base"
    assert train(model, table, base, 2) == 0 and steps_of(base) == [1, 2]
    capsys.readouterr()
    lines = (base / "metrics.jsonl").read_text().splitlines(keepends=True)

    def attempt(name, text):
        run = tmp_path / name
        shutil.copytree(base, run)
        (run / "train_summary.json").unlink()
        if text is None:
            (run / "metrics.jsonl").unlink()
        else:
            (run / "metrics.jsonl").write_text(text)
        return run, train(model, table, run, 3), marble_lines(capsys)

    other = json.dumps({**json.loads(lines[0]), "loss/total": 123.0}) + "\n"
    for name, text, needle in [
        ("deleted", None, "metrics.jsonl: missing"),
        ("cut", lines[1], "metrics.jsonl:1: step 1 missing"),
        ("other values", lines[0] + other + lines[1], "metrics.jsonl:2: step 1 logged again with other values"),
        ("out of order", lines[1] + lines[0], "metrics.jsonl:2: step 1 after step 2"),
    ]:
        run, code, out = attempt(name.replace(" ", "-"), text)
        fault_trials.record(code == 2 and len(out) == 1 and needle in out[0] and "--fresh" in out[0]
                            and not (run / "train_summary.json").exists(), f"{name}: exit {code}, {out}")
    with pytest.warns(UserWarning, match=r"metrics.jsonl: lines 2 repeated a logged step"):
        run, code, _ = attempt("repeated", lines[0] + lines[0] + lines[1])
    fault_trials.record(code == 0 and steps_of(run) == [1, 2, 3], f"a line repeated alike: {steps_of(run)}")
    assert not fault_trials.lost, fault_trials.lost
