"""The checkpoint manager's registry: every registered state saved and restored, on the
format-2 layout; a checkpoint lacking a registered state (or holding one nobody restores)
is refused naming it. No model: a Linear, AdamW and toy states keep this under a second."""

from __future__ import annotations

import random
import types

import numpy as np
import pytest
import torch

from marble.training.checkpoint import (
    AttributeState,
    CheckpointError,
    CheckpointManager,
    OptionalState,
    RNGState,
    load_checkpoint,
)


class Counter:
    """A toy Stateful with a tensor inside (as the sampler and balancer are)."""

    def __init__(self):
        self.values = torch.zeros(3)

    def state_dict(self) -> dict:
        return {"values": self.values.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.values = state["values"].clone()


class Adapters:
    """The "adapters" state's shape: {adapter: {key: tensor}} (written as safetensors)."""

    def __init__(self, layer: torch.nn.Linear):
        self.layer = layer

    def state_dict(self) -> dict:
        return {"default": {k: v.detach().clone() for k, v in self.layer.state_dict().items()}}

    def load_state_dict(self, state: dict) -> None:
        self.layer.load_state_dict(state["default"])


class Run:
    """What the trainer holds, in miniature."""

    def __init__(self, run_dir, extra: dict | None = None, scaler=None):
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(3, 2)
        self.optimizer = torch.optim.AdamW(self.layer.parameters(), lr=0.1)
        self.counter, self.step, self.epoch = Counter(), 0, 0
        states = {"adapters": Adapters(self.layer), "optimizer": self.optimizer,
                  "step": AttributeState(self, "step"), "epoch": AttributeState(self, "epoch"),
                  "counter": self.counter, "scaler": OptionalState(scaler, "fp16 GradScaler"),
                  "rng": RNGState(), **(extra or {})}
        self.manager = CheckpointManager(run_dir, states, keep=None)

    def train_step(self) -> None:
        self.layer(torch.randn(4, 3)).square().sum().backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.counter.values += torch.rand(3)
        self.step += 1
        self.epoch += 1


def test_every_registered_state_is_saved_and_restored(tmp_path):
    run = Run(tmp_path)
    for _ in range(2):
        run.train_step()
    path = run.manager.save(run.step)
    # The layout of format 2 (older checkpoints resume): own files for adapters and the
    # optimizer, every other state a key of state.pt.
    assert sorted(p.name for p in path.iterdir()) == [
        "COMPLETE", "adapters.safetensors", "optimizer.pt", "state.pt"]
    assert sorted(load_checkpoint(path)["state"]) == ["counter", "epoch", "rng", "scaler", "step"]
    expected = (random.random(), np.random.rand())
    run.train_step()
    later = Run(tmp_path)  # a fresh process: every state at its init
    assert later.manager.resume() == path
    assert (later.step, later.epoch) == (2, 2)
    assert (random.random(), np.random.rand()) == expected
    later.train_step()  # its torch draws continue the saved generator
    reference = Run(tmp_path / "straight")
    for _ in range(3):
        reference.train_step()
    assert torch.equal(later.layer.weight, reference.layer.weight)
    assert torch.equal(later.counter.values, reference.counter.values)
    assert later.optimizer.state_dict()["state"][0]["step"] == 3


def test_a_registered_state_the_checkpoint_lacks_is_refused(tmp_path):
    Run(tmp_path).manager.save(1)
    stage = AttributeState(types.SimpleNamespace(stage=4), "stage")
    with pytest.raises(CheckpointError, match=r"checkpoint-000001: .*no saved state for stage$"):
        Run(tmp_path, extra={"stage": stage}).manager.resume()


def test_a_saved_state_no_registered_state_restores_is_refused(tmp_path):
    stage = AttributeState(types.SimpleNamespace(stage=4), "stage")
    Run(tmp_path, extra={"stage": stage}).manager.save(1)
    with pytest.raises(CheckpointError, match="no registered state restores stage"):
        Run(tmp_path).manager.resume()


def test_a_state_that_does_not_fit_names_itself(tmp_path):
    Run(tmp_path).manager.save(1)
    scaler = torch.amp.GradScaler("cpu")
    with pytest.raises(CheckpointError,
                       match=r"state 'scaler' does not fit .*lacks a fp16 GradScaler"):
        Run(tmp_path, scaler=scaler).manager.resume()


def test_a_checkpoint_of_another_run_identity_is_refused_naming_both(tmp_path, caplog):
    mine = {"config": "sha256:aa", "base": "tree:11", "train_table": "sha256:22", "seed": 42}
    run = Run(tmp_path)
    run.manager.identity = {**mine, "config": "sha256:bb"}  # another preset's run wrote it
    run.train_step()
    path = run.manager.save(1)
    assert "identity.json" in (path / "COMPLETE").read_text()  # under the marker's hashes
    later = Run(tmp_path)
    later.manager.identity = mine
    with pytest.raises(CheckpointError) as err:
        later.manager.resume()
    message = str(err.value)
    assert "\n" not in message and "another run" in message and "--adopt-checkpoint" in message
    assert "config sha256:bb in the checkpoint, sha256:aa in this run" in message
    assert later.step == 0  # nothing restored
    later.manager.adopt = True  # the named override: a deliberate warm start
    assert later.manager.resume() == path and later.step == 1
    same = Run(tmp_path)
    same.manager.identity = {**mine, "config": "sha256:bb"}
    assert same.manager.resume() == path and same.step == 1


def test_a_checkpoint_from_before_identities_resumes_with_a_warning(tmp_path, caplog):
    old = Run(tmp_path)  # identity None: what a marble before identities wrote
    path = old.manager.save(0)
    assert not (path / "identity.json").exists()
    later = Run(tmp_path)
    later.manager.identity = {"config": "sha256:aa", "base": "tree:11", "train_table": None, "seed": 1}
    assert later.manager.resume() == path
    assert "records no run identity" in caplog.text
