"""The policy model as training builds it, defined once (trainer, `marble bench`, gpu check).

Pipeline with the base transformer in `model.base_dtype` (fp32 by default, as the
reference), the text encoders in the autocast dtype on CUDA (fp32 on the CPU) or not
loaded at all, then the "default" + "old" LoRA adapters seeded from `seed`, upcast to
fp32 (master weights for AdamW / GradScaler).
"""

from __future__ import annotations

import random

import numpy as np
import torch

from marble.models.loading import load_pipeline
from marble.models.lora import add_lora_adapters, trainable_lora_parameters
from marble.runtime.precision import base_weight_dtype, text_encoder_dtype, upcast_lora_

__all__ = ["seed_everything", "load_policy"]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


def load_policy(model_cfg, seed: int, device, text_encoders: bool = True,
                path: str | None = None):
    """(pipe, trainable LoRA parameters) for `model_cfg` (a `ModelConfig`) on `device`;
    `path` overrides `model_cfg.path` (its revision then does not apply)."""
    m, dev = model_cfg, torch.device(device)
    pipe = load_pipeline(
        path or m.path, revision=None if path else m.revision,
        dtype=text_encoder_dtype(m.mixed_precision, dev), device=dev,
        transformer_dtype=base_weight_dtype(m.base_dtype), text_encoders=text_encoders)
    seed_everything(seed)  # same LoRA init on every rank
    add_lora_adapters(pipe.transformer, rank=m.lora_rank, alpha=m.lora_alpha,
                      targets=m.lora_targets, seed=seed)
    upcast_lora_(pipe.transformer)
    return pipe, trainable_lora_parameters(pipe.transformer)
