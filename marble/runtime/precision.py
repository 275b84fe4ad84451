"""Mixed precision as torch documents it: autocast, GradScaler, and one optimizer update.

The reference (DiffusionNFT / MARBLE `train.py`) keeps the frozen base transformer in
fp32 and runs it under fp16 autocast with a GradScaler; text encoders run in the
autocast dtype, the VAE in fp32, TF32 matmuls are on. `model.base_dtype` can put the
base weights in fp16/bf16 instead: SD3.5 Medium's transformer has 2.243 B parameters,
9.0 GB in fp32 versus 4.5 GB in fp16/bf16 (per GPU, before activations and adapters).

`optimizer_update` is the end of one optimizer step: the mean of .grad over ranks
(still loss-scaled), one found-inf flag combined over ranks, unscale, clip, step or
skip. Every rank then takes the same decision, so parameters stay equal on all ranks.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from marble.runtime import distributed as dist

DTYPES = {"no": torch.float32, "fp32": torch.float32, "fp16": torch.float16,
          "bf16": torch.bfloat16}


@dataclass
class Precision:
    """A zero-arg autocast context factory (call it) plus the fp16 GradScaler, if any.

    Autocast runs on the CPU too (fp16 and bf16 both work there in torch >= 2.3),
    which is what lets CI exercise the fp16 + GradScaler path without a GPU.
    """

    mixed_precision: str
    device: torch.device
    scaler: torch.amp.GradScaler | None = None

    def __call__(self):
        if self.mixed_precision == "no":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=DTYPES[self.mixed_precision])


def make_precision(mixed_precision: str, device: torch.device) -> Precision:
    """fp16 gets a GradScaler on the same device type; bf16 and fp32 need none."""
    if mixed_precision not in ("no", "fp16", "bf16"):
        raise ValueError(f"mixed_precision must be no, fp16 or bf16, got {mixed_precision!r}")
    scaler = torch.amp.GradScaler(device.type) if mixed_precision == "fp16" else None
    return Precision(mixed_precision, torch.device(device), scaler)


def base_weight_dtype(base_dtype: str) -> torch.dtype:
    """dtype of the frozen base transformer weights (`model.base_dtype`)."""
    if base_dtype not in ("fp32", "fp16", "bf16"):
        raise ValueError(f"model.base_dtype must be fp32, fp16 or bf16, got {base_dtype!r}")
    return DTYPES[base_dtype]


def text_encoder_dtype(mixed_precision: str, device: torch.device) -> torch.dtype:
    """The reference runs the text encoders in the autocast dtype; fp32 on the CPU."""
    return DTYPES[mixed_precision] if torch.device(device).type == "cuda" else torch.float32


def enable_tf32(device: torch.device, allow: bool = True) -> None:
    """TF32 matmuls and convolutions on CUDA, as the reference sets them."""
    if torch.device(device).type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = allow
        torch.backends.cudnn.allow_tf32 = allow


@torch.no_grad()
def upcast_lora_(transformer) -> None:
    """Adapter weights in fp32 over fp16/bf16 base weights: AdamW and GradScaler.unscale_
    need fp32 master weights (a no-op when everything is already fp32)."""
    for name, param in transformer.named_parameters():
        if "lora_" in name and param.dtype != torch.float32:
            param.data = param.data.float()


def loss_scale(precision: Precision | None) -> float:
    """The GradScaler's current factor (1.0 without one); what `.grad` is multiplied by."""
    if precision is None or precision.scaler is None:
        return 1.0
    return float(precision.scaler.get_scale())


def all_reduce_grads_(params: list) -> None:
    """Mean of .grad over ranks in one flat collective (no DDP wrapper, see ARCHITECTURE).

    Runs on the still-scaled gradients, before unscale_, as DDP does: an inf or NaN on
    one rank then reaches every rank's gradient.
    """
    if dist.world().world_size == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = dist.all_reduce_mean_(torch.cat([g.reshape(-1).float() for g in grads]))
    offset = 0
    for p in params:
        numel = p.numel()
        p.grad = flat[offset:offset + numel].view_as(p).to(p.dtype).clone()
        offset += numel


def grads_finite(params: list) -> bool:
    """Whether every .grad entry is finite (a missing .grad counts as zeros)."""
    flags = [torch.isfinite(p.grad).all() for p in params if p.grad is not None]
    return bool(torch.stack(flags).all()) if flags else True  # one device sync, not one per p


@torch.no_grad()
def _poison_grads_(params: list) -> None:
    """Make an overflow visible to GradScaler.unscale_ (its documented skip + backoff)."""
    for p in params:
        if p.grad is not None:
            p.grad.fill_(float("inf"))
            return
    params[0].grad = torch.full_like(params[0], float("inf"))


def optimizer_update(params: list, optimizer: torch.optim.Optimizer,
                     precision: Precision | None, max_grad_norm: float,
                     hidden_nonfinite: float = 0.0) -> dict:
    """All-reduce, combine found-inf over ranks, unscale, clip, step (or skip); zero grads.

    `hidden_nonfinite` counts gradient entries a balancer zeroed before writing .grad
    (the full solve's sanitising): an overflow there must still skip the step. A skipped
    step leaves the parameters and the optimizer state untouched on every rank; with a
    GradScaler it also halves the scale (its own backoff, via unscale_ seeing an inf).
    Returns `grad_norm` (unscaled; NaN/inf on a skipped step), `skipped_step`, `loss_scale`.
    """
    scaler = precision.scaler if precision is not None else None
    all_reduce_grads_(params)
    local_bad = hidden_nonfinite > 0 or not grads_finite(params)
    # One flag for all ranks before anyone steps: the max over ranks of "I saw an inf".
    found_inf = dist.any_rank(local_bad, params[0].device)
    scale_used = loss_scale(precision)
    if found_inf:
        if scaler is not None:
            _poison_grads_(params)  # identical on every rank: every scaler skips and backs off
            scaler.unscale_(optimizer)
            scaler.step(optimizer)
            scaler.update()
        optimizer.zero_grad(set_to_none=True)
        return {"grad_norm": float("nan"), "skipped_step": 1.0, "loss_scale": scale_used}
    if scaler is not None:
        scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"grad_norm": float(grad_norm), "skipped_step": 0.0, "loss_scale": scale_used}
