"""Scorers on the rank's GPU: `train.reward_device`, the scorer threads' CUDA device,
and text encoders left unloaded when the embedding cache serves the prompts."""

from __future__ import annotations

import threading

import pytest
import torch

from marble.config import ConfigError, load_config
from marble.training.rollout import RewardScorer
from marble.rewards import takes_device
from marble.training.trainer import reward_device


def test_reward_device_resolution(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert reward_device("auto", 3) == "cuda:3"
    assert reward_device("cuda", 1) == "cuda:1"
    assert reward_device("cuda:0", 5) == "cuda:0"
    assert reward_device("cpu", 2) == "cpu"
    assert reward_device("auto", 3, cuda=False) == "cpu"  # a run forced onto the CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert reward_device("auto", 3) == "cpu"
    assert load_config("tiny").train.reward_device == "auto"
    with pytest.raises(ConfigError, match="train.reward_device"):
        load_config("tiny", overrides=["train.reward_device=gpu0"])


def test_device_option_goes_to_scorers_that_take_one():
    assert takes_device("pickscore") and takes_device("hpsv2")
    assert not takes_device("toy_brightness")


def test_scorer_threads_set_their_cuda_device(monkeypatch):
    """A new thread's current device is cuda:0; the pool initializer moves it to the rank's."""
    calls = []

    def set_device(device):  # torch.cuda.set_device's signature
        calls.append((threading.current_thread().name, torch.device(device)))

    monkeypatch.setattr(torch.cuda, "set_device", set_device)

    def reward(images, prompts, metadata):
        return torch.ones(len(prompts))

    scorer = RewardScorer({"a": reward, "b": reward}, {}, device="cuda:1")
    try:
        futures = scorer.submit(torch.zeros(2, 3, 4, 4), ["x", "y"], [{}, {}], [0, 1])
        assert all(f.result().tolist() == [1.0, 1.0] for f in futures)
    finally:
        scorer.close()
    assert calls and all(name.startswith("reward") and dev == torch.device("cuda:1")
                         for name, dev in calls)
    cpu = RewardScorer({"a": reward}, {}, device="cpu")
    cpu.submit(torch.zeros(1, 3, 4, 4), ["x"], [{}], [0])[0].result()
    cpu.close()
    assert len(calls) <= 2  # the cpu pool never touched CUDA


def test_text_encoders_not_loaded_for_the_cache(tiny_model_dir):
    from marble.models import load_pipeline

    pipe = load_pipeline(str(tiny_model_dir), text_encoders=False)
    assert pipe.text_encoder is None and pipe.text_encoder_2 is None
    assert pipe.text_encoder_3 is None and pipe.transformer is not None
    full = load_pipeline(str(tiny_model_dir), dtype=torch.bfloat16,
                         transformer_dtype=torch.float32)
    assert next(full.transformer.parameters()).dtype == torch.float32  # model.base_dtype
    assert next(full.text_encoder_3.parameters()).dtype == torch.bfloat16
    assert next(full.vae.parameters()).dtype == torch.float32


def test_training_with_the_cache_loads_no_text_encoder(tiny_model_dir, tmp_path):
    """One optimizer step of a Trainer whose prompts come from the embedding cache."""
    from marble.data.embed_cache import build_cache
    from marble.data.records import PromptRecord, to_frame
    from marble.runtime import distributed as dist
    from marble.training.trainer import Trainer

    table = tmp_path / "train.parquet"
    to_frame([PromptRecord.make("a castle at dawn", "pickscore"),
              PromptRecord.make('a sign that says "hi"', "ocr")]).to_parquet(table)
    build_cache([str(table)], str(tiny_model_dir), tmp_path / "cache", max_sequence_length=32)
    cfg = load_config("tiny", overrides=[
        f"model.path={tiny_model_dir}", f"data.train={table}", f"data.embed_cache={tmp_path / 'cache'}",
        "data.stratified=false", "sampling.num_steps=2", "sampling.resolution=32",
        "sampling.images_per_prompt=2", "sampling.batch_size=4", "sampling.num_batches_per_epoch=1",
        "train.batch_size=4", "rewards=[{name: toy_brightness}]"])
    trainer = Trainer(cfg, tmp_path / "run", device="cpu", progress=False)
    try:
        assert trainer.pipe.text_encoder is None and trainer.pipe.text_encoder_3 is None
        record = trainer.train_epoch()
    finally:
        trainer.close()
        dist.cleanup()
    assert trainer.step == 1 and record["skipped_step"] == 0.0
    assert torch.isfinite(torch.tensor(record["loss/policy"]))
