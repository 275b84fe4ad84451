"""Checkpoints: atomic layout, COMPLETE marker, pruning, weights_only loading, RNG round trip;
metrics log truncation on resume."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from marble.training.checkpoint import (
    COMPLETE,
    CheckpointError,
    capture_rng_state,
    checkpoint_dir,
    damaged_files,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    restore_rng_state,
    resume_checkpoint,
    save_checkpoint,
)
from marble.training.metrics import MetricsLog, StepAverager, advantage_std, reward_stats


def _save(run, step, keep=3):
    adapters = {"default": {"a.lora_A.weight": torch.full((2, 3), float(step))},
                "old": {"a.lora_A.weight": torch.zeros(2, 3)}}
    opt = {"state": {0: {"step": torch.tensor(float(step)), "exp_avg": torch.ones(2)}},
           "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0]}]}
    state = {"step": step, "epoch": step, "rng": capture_rng_state(),
             "balancer": {"alpha_cache": [0.25, 0.75], "last_full": None}}
    return save_checkpoint(checkpoint_dir(run, step), state, adapters=adapters,
                           optimizer_state=opt,
                           write_lora=lambda d: (d.mkdir(), (d / "w.txt").write_text("ema")),
                           keep=keep)


def test_save_load_round_trip_weights_only(tmp_path):
    path = _save(tmp_path, 7)
    assert path.name == "checkpoint-000007"
    assert sorted(p.name for p in path.iterdir()) == [
        "COMPLETE", "adapters.safetensors", "lora", "optimizer.pt", "state.pt"]
    # Everything must load under the restricted unpickler.
    torch.load(path / "state.pt", weights_only=True)
    ck = load_checkpoint(path)
    assert ck["state"]["step"] == 7
    assert ck["state"]["balancer"]["alpha_cache"] == [0.25, 0.75]
    assert torch.equal(ck["adapters"]["default"]["a.lora_A.weight"], torch.full((2, 3), 7.0))
    assert ck["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
    assert (path / "lora" / "w.txt").read_text() == "ema"


def test_incomplete_checkpoints_are_ignored(tmp_path):
    _save(tmp_path, 2)
    broken = checkpoint_dir(tmp_path, 4)
    broken.mkdir(parents=True)
    (broken / "state.pt").write_bytes(b"torn")
    (broken.parent / ".checkpoint-000006.abc.tmp").mkdir()
    assert latest_checkpoint(tmp_path).name == "checkpoint-000002"
    with pytest.raises(FileNotFoundError, match="COMPLETE"):
        load_checkpoint(broken)


def test_a_run_whose_only_checkpoint_is_half_written_starts_over(tmp_path):
    """A kill during the first save leaves a folder without COMPLETE: that is no checkpoint
    (the run starts from step 0), not a damaged one (which would stop the resume)."""
    broken = checkpoint_dir(tmp_path, 1)
    broken.mkdir(parents=True)
    (broken / "state.pt").write_bytes(b"torn")
    assert list_checkpoints(tmp_path) == []
    assert resume_checkpoint(tmp_path) is None


def test_failed_write_leaves_nothing(tmp_path):
    def boom(_):
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        save_checkpoint(checkpoint_dir(tmp_path, 3), {"step": 3}, write_lora=boom)
    assert latest_checkpoint(tmp_path) is None
    assert list((tmp_path / "checkpoints").iterdir()) == []


def test_keep_prunes_oldest(tmp_path):
    for step in (1, 2, 3, 4, 5):
        _save(tmp_path, step, keep=3)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 4, 5]
    assert latest_checkpoint(tmp_path).name == "checkpoint-000005"


def test_marker_records_sha256_of_every_file(tmp_path):
    import hashlib

    path = _save(tmp_path, 3)
    marker = json.loads((path / COMPLETE).read_text())
    assert marker["format"] == 2
    assert sorted(marker["sha256"]) == ["adapters.safetensors", "lora/w.txt", "optimizer.pt",
                                        "state.pt"]
    assert marker["sha256"]["lora/w.txt"] == hashlib.sha256(b"ema").hexdigest()
    assert damaged_files(path) == []


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_damaged_newest_checkpoint_falls_back_with_a_warning(tmp_path, caplog):
    for step in (5, 6):
        _save(tmp_path, step)
    _truncate(checkpoint_dir(tmp_path, 6) / "optimizer.pt")
    (checkpoint_dir(tmp_path, 6) / "lora" / "w.txt").unlink()
    assert resume_checkpoint(tmp_path) == checkpoint_dir(tmp_path, 5)
    text = caplog.text
    assert "checkpoint-000006" in text and "optimizer.pt (sha256 differs" in text
    assert "lora/w.txt (missing)" in text and "falling back" in text


def test_no_intact_checkpoint_is_an_error_naming_the_run(tmp_path):
    assert resume_checkpoint(tmp_path) is None  # a fresh run folder
    _save(tmp_path, 2)
    _truncate(checkpoint_dir(tmp_path, 2) / "state.pt")
    with pytest.raises(CheckpointError, match=str(tmp_path)):
        resume_checkpoint(tmp_path)


def test_marker_without_hashes_is_damaged_and_load_names_a_bad_file(tmp_path, caplog):
    _save(tmp_path, 3)
    path = _save(tmp_path, 4)
    (path / COMPLETE).write_text("ok\n")  # what markers held before hashes: unverifiable
    assert damaged_files(path)[0].startswith("COMPLETE (unreadable or not JSON")
    assert resume_checkpoint(tmp_path) == checkpoint_dir(tmp_path, 3)
    assert "checkpoint-000004 is damaged: COMPLETE" in caplog.text
    # load_checkpoint (called on a verified folder) still names a file torch cannot read.
    _truncate(path / "optimizer.pt")
    with pytest.raises(CheckpointError, match=r"checkpoint-000004/optimizer\.pt: unreadable"):
        load_checkpoint(path)


def test_rng_state_round_trip(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    state = capture_rng_state()
    torch.save(state, tmp_path / "rng.pt")
    first = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    restore_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == first


def test_metrics_truncate_after_resumed_step(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    for step in (1, 2, 3):
        log.log({"step": step, "loss": torch.tensor(0.5)})
    with open(log.path, "a") as fh:
        fh.write('{"step": 4, "lo')  # torn line of a killed process
    assert log.truncate_after(2) == 2
    assert [r["step"] for r in log.read()] == [1, 2]
    assert log.read()[0]["loss"] == 0.5


def test_reward_stats_counts_nan_and_masks():
    rewards = torch.tensor([1.0, float("nan"), 3.0, float("nan")])
    applicable = torch.tensor([True, True, True, False])
    out = reward_stats("r", rewards, applicable)
    assert out == {"reward/r": 2.0, "reward_applicable/r": 3, "reward_nan/r": 1}
    assert advantage_std(torch.tensor([1.0, float("nan"), 3.0])) == pytest.approx(2**0.5)


def test_step_averager_skips_nonfinite_and_keeps_last():
    avg = StepAverager(last_keys=("full_solve",))
    avg.add({"cos/a": 0.5, "full_solve": 1.0, "alpha/a": 0.2})
    avg.add({"cos/a": float("nan"), "full_solve": 0.0, "alpha/a": 0.4})
    avg.add({"cos/a": 0.25})
    out = avg.result()
    assert out["cos/a"] == pytest.approx(0.375)
    assert out["full_solve"] == 0.0 and out["alpha/a"] == 0.4
    assert json.dumps(out)
