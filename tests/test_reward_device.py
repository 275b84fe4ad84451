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


def test_evaluation_puts_scorers_on_the_requested_device(tmp_path):
    """marble evaluate's scorers: a device-taking scorer is built on the rank's device (here
    `meta`: the plumbing, no GPU needed), a scorer's own `device` option wins, the rest take
    none; run_info's record says where each ran."""
    from rewards_tiny_clip import save_tiny_clip

    from marble.config import RewardSpec
    from marble.evaluation.runner import build_scorers, describe_scorers

    clip = str(save_tiny_clip(tmp_path / "clip"))
    rewards = build_scorers([RewardSpec(name="clipscore", options={"model": clip}),
                             RewardSpec(name="pickscore", options={"model": clip, "device": "cpu"}),
                             RewardSpec(name="toy_brightness")], "meta")
    assert next(rewards["clipscore"].model.parameters()).device.type == "meta"
    assert next(rewards["pickscore"].model.parameters()).device.type == "cpu"
    described = describe_scorers(rewards)
    assert described["clipscore"]["device"] == "meta" and described["pickscore"]["device"] == "cpu"
    assert described["toy_brightness"] == {"class": type(rewards["toy_brightness"]).__name__,
                                           "device": None, "engine": None}


def test_evaluate_reward_device_flag():
    from marble import evaluate

    assert evaluate.parse_args(["--dataset", "ocr"]).reward_device == "auto"
    assert evaluate.parse_args(["--dataset", "ocr", "--reward_device", "cuda:2"]).reward_device == "cuda:2"
    with pytest.raises(SystemExit):
        evaluate.parse_args(["--dataset", "ocr", "--reward_device", "gpu0"])


def test_precision_setup_is_the_reference_numerics_on_cuda_only():
    from marble.evaluation.runner import precision_setup

    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:  # the flags are process-wide: restored after
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        assert precision_setup(torch.device("cpu"), "fp16") == {"device": "cpu", "dtype": "float16",
                                                               "tf32": False, "autocast": None}
        assert not torch.backends.cuda.matmul.allow_tf32
        on = precision_setup(torch.device("cuda", 1), "fp16")
        assert on == {"device": "cuda:1", "dtype": "float16", "tf32": True, "autocast": "float16"}
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
