"""Load a StableDiffusion3Pipeline from a hub id, a local folder, or build one in memory.

`random:tiny` is the tiny pipeline of `marble.models.tiny`; `random:sd35m` swaps in a
randomly initialised transformer and VAE with SD3.5 Medium's real configs (for benchmarks
at paper scale; its text encoders stay tiny, since benchmarks feed random embeddings of
the right width).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from marble.models.tiny import (
    SD35M_TEXT_WIDTHS,
    SD35M_TRANSFORMER_CONFIG,
    SD35M_VAE_CONFIG,
    TINY_TEXT_WIDTHS,
    build_tiny_pipeline,
)

RANDOM_PREFIX = "random:"
RANDOM_MODELS = ("random:tiny", "random:sd35m")


class ModelNotFoundError(FileNotFoundError):
    """A local model folder that does not exist (message says how to create it)."""


def looks_local(path: str) -> bool:
    """Whether `path` must be a local folder: './x', '~/x', '/x', or more than one slash.

    A hub id is exactly `owner/name`; such a string is still used as a folder when one
    exists on disk (the caller checks that).
    """
    return path.startswith((".", "~", "/")) or path.count("/") >= 2 or "\\" in path


def _missing_model_message(path: str) -> str:
    return (f"model folder {path!r} not found. Create it with "
            f"`marble models tiny --out {path}` (tiny random model, no download) or "
            f"`marble download model --out {path}` (SD3.5 Medium from the hub, needs HF_TOKEN).")


def build_random_pipeline(name: str, dtype: torch.dtype = torch.float32, device="cpu",
                          transformer_dtype: torch.dtype | None = None, text_encoders: bool = True):
    """`random:tiny` or `random:sd35m`, built in memory from configs."""
    from diffusers import AutoencoderKL, SD3Transformer2DModel

    if name not in RANDOM_MODELS:
        raise ModelNotFoundError(f"unknown in-memory model {name!r}; choose one of {RANDOM_MODELS}")
    sd35m = name == "random:sd35m"
    pipe = build_tiny_pipeline(seed=0, text_widths=SD35M_TEXT_WIDTHS if sd35m else TINY_TEXT_WIDTHS)
    if sd35m:
        # Build directly on the target device: a 2.2 B-parameter init on the CPU is slow.
        with torch.random.fork_rng(devices=[]), torch.device(device):
            torch.manual_seed(0)
            transformer = SD3Transformer2DModel(**SD35M_TRANSFORMER_CONFIG)
            vae = AutoencoderKL(**SD35M_VAE_CONFIG)  # the real-size decode
        pipe.register_modules(transformer=transformer, vae=vae)
    if not text_encoders:
        pipe.register_modules(text_encoder=None, text_encoder_2=None, text_encoder_3=None)
    return _place(pipe, dtype, device, transformer_dtype)


def _place(pipe, dtype: torch.dtype, device, transformer_dtype: torch.dtype | None = None):
    """Move to device; everything in `dtype` except the VAE, which stays fp32 (docs/algorithm.md §6, §10),
    and the transformer, in `transformer_dtype` when given (`model.base_dtype`)."""
    from diffusers.utils import logging as diffusers_logging

    # diffusers warns on every explicit cast of a model; the cast here is deliberate.
    level = diffusers_logging.get_verbosity()
    diffusers_logging.set_verbosity_error()
    try:
        _move_components(pipe, dtype, device, transformer_dtype or dtype)
    finally:
        diffusers_logging.set_verbosity(level)
    return pipe


def cast_pipeline(pipe, dtype: torch.dtype, device):
    """`pipe`'s components cast as load_pipeline casts them (the VAE stays fp32): for a pipeline
    loaded in fp32 and changed first (evaluation's reference numerics merge a LoRA, then cast)."""
    return _place(pipe, dtype, device)


def _move_components(pipe, dtype: torch.dtype, device, transformer_dtype: torch.dtype) -> None:
    for name in ("transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3"):
        module = getattr(pipe, name, None)
        if module is None:
            continue
        want = {"vae": torch.float32, "transformer": transformer_dtype}.get(name, dtype)
        param = next(module.parameters())
        # Only call .to() when something changes (diffusers warns on every cast).
        if param.dtype != want or param.device != torch.device(device):
            module.to(device=device, dtype=want)
        module.requires_grad_(False)


def load_pipeline(path: str, *, revision: str | None = None, dtype: torch.dtype = torch.float32,
                  device="cpu", transformer_dtype: torch.dtype | None = None,
                  text_encoders: bool = True):
    """A StableDiffusion3Pipeline from a hub id, a local folder, or `random:tiny|sd35m`.

    All weights are frozen (requires_grad False); LoRA adapters added later are the only
    trainable parameters. `transformer_dtype` (default `dtype`) is the base transformer's
    weight dtype. `text_encoders=False` skips loading the three text encoders (a run
    reading prompt embeddings from the cache never uses them: ~11 GB for SD3.5 Medium).
    """
    from diffusers import StableDiffusion3Pipeline

    path = str(path)
    if path.startswith(RANDOM_PREFIX):
        return build_random_pipeline(path, dtype=dtype, device=device,
                                     transformer_dtype=transformer_dtype,
                                     text_encoders=text_encoders)
    skip = {} if text_encoders else {"text_encoder": None, "text_encoder_2": None,
                                     "text_encoder_3": None}
    local = Path(path).expanduser()
    if looks_local(path) or local.exists():
        if not local.is_dir():
            raise ModelNotFoundError(_missing_model_message(path))
        if not (local / "model_index.json").is_file():
            raise ModelNotFoundError(
                f"model folder {path!r} has no model_index.json: not a diffusers pipeline folder. "
                + _missing_model_message(path).split(". ", 1)[1])
        # Load in fp32 then cast: keeps the VAE in fp32 whatever `dtype` is.
        pipe = StableDiffusion3Pipeline.from_pretrained(
            str(local), local_files_only=True, dtype=torch.float32, **skip)
    else:
        pipe = StableDiffusion3Pipeline.from_pretrained(
            path, revision=revision, token=os.environ.get("HF_TOKEN"), dtype=torch.float32, **skip)
    pipe.set_progress_bar_config(disable=True)
    return _place(pipe, dtype, device, transformer_dtype)


def load_text_to_image(path: str, *, dtype: torch.dtype = torch.float32, device="cpu"):
    """Any diffusers text-to-image pipeline from a local folder (its model_index.json names the
    class: StableDiffusionXLPipeline, FluxPipeline, StableDiffusion3Pipeline for SD3.5-L, ...),
    for the Table 1 base rows evaluated as their own pipelines do. Every component is cast to
    `dtype`: the pipeline's own decode handles its VAE (SD-XL upcasts a fp16 VAE itself via
    `force_upcast`), unlike `load_pipeline`, whose fp32 VAE serves training's decode."""
    from diffusers import DiffusionPipeline

    local = Path(str(path)).expanduser()
    if not (local / "model_index.json").is_file():
        raise ModelNotFoundError(f"model folder {path!r} has no model_index.json: not a diffusers "
                                 "pipeline folder (the workflow fetches a row's `hf:` model first)")
    pipe = DiffusionPipeline.from_pretrained(str(local), local_files_only=True, dtype=dtype)
    pipe.set_progress_bar_config(disable=True)
    for module in pipe.components.values():
        if isinstance(module, torch.nn.Module):
            module.requires_grad_(False)
    return pipe.to(device)
