"""Evaluation's two numerics modes (issue 29 item 3): `reference` merges a hub LoRA into the
fp32 transformer before the cast and decodes inside the autocast; `marble` keeps it unmerged."""

from __future__ import annotations

import torch
from peft import LoraConfig
from peft.tuners.tuners_utils import BaseTunerLayer

from marble.evaluation.runner import load_eval_pipeline
from marble.models.lora import merge_lora
from beds import replicas


def test_merge_lora_adds_the_delta_exactly_in_fp32():
    from peft import get_peft_model

    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(8, 8))
    model = get_peft_model(base, LoraConfig(r=2, lora_alpha=4, target_modules=["0"], init_lora_weights="gaussian"))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data.normal_()
    x = torch.randn(3, 8)
    before = model(x)
    layer = model.base_model.model[0]
    w0, delta = layer.base_layer.weight.detach().clone(), layer.get_delta_weight("default")
    assert merge_lora(model) == 1 and merge_lora(model) == 0  # merged once
    assert torch.allclose(layer.base_layer.weight, w0 + delta) and torch.allclose(model(x), before, atol=1e-5)


def test_reference_mode_merges_before_the_cast_marble_mode_does_not(tmp_path):
    replicas.sd3_peft_lora_repo(tmp_path / "lora", seed=3)
    modes = {}
    for mode in ("reference", "marble"):
        pipe = load_eval_pipeline("random:tiny", "fp16", torch.device("cpu"), tmp_path / "lora", "sd3", mode)
        layers = [m for m in pipe.transformer.modules() if isinstance(m, BaseTunerLayer)]
        modes[mode] = (layers, pipe)
        assert layers and next(pipe.transformer.parameters()).dtype == torch.float16, mode
        assert next(pipe.vae.parameters()).dtype == torch.float32, mode  # the VAE stays fp32
    assert all(m.merged for m in modes["reference"][0]) and not any(m.merged for m in modes["marble"][0])


def test_reference_mode_decodes_inside_the_autocast_marble_mode_outside(monkeypatch):
    """The VAE decode's place (no CUDA here: the pipeline reports a CUDA device, torch.autocast
    records whether it is active, sampling and decode are stand-ins with the real signatures)."""
    import contextlib
    import types

    from marble.evaluation import runner
    from marble.evaluation.prompts import EvalSample

    active = []

    @contextlib.contextmanager
    def autocast(device_type, dtype=None, enabled=True, cache_enabled=None):
        active.append(enabled)
        try:
            yield
        finally:
            active.pop()

    def sd3_latents(pipe, samples, generators, args):
        return torch.zeros(len(samples), 4, 2, 2)

    seen = {}

    def decode_latents(pipe, latents):
        seen["autocast"] = bool(active and active[-1])
        return torch.zeros(latents.shape[0], 3, 8, 8)

    monkeypatch.setattr(runner.torch, "autocast", autocast)
    monkeypatch.setattr(runner, "sd3_latents", sd3_latents)
    monkeypatch.setattr(runner, "decode_latents", decode_latents)
    pipe = types.SimpleNamespace(transformer=types.SimpleNamespace(device=torch.device("cuda")))
    samples = [EvalSample(sample_id=0, prompt_id="p0", prompt="a cat")]
    for mode, inside in (("reference", True), ("marble", False)):
        args = types.SimpleNamespace(seed=0, mixed_precision="fp16", numerics=mode, model_type="sd3")
        assert runner.generate_images(pipe, samples, args).shape == (1, 3, 8, 8)
        assert seen.pop("autocast") is inside, mode
