"""Prompt encoding, the transformer's velocity, latent decoding (docs/algorithm.md §2, §4)."""

from __future__ import annotations

import torch
from torch import Tensor


@torch.no_grad()
def encode_prompts(pipe, prompts: list[str], max_sequence_length: int) -> tuple[Tensor, Tensor]:
    """(prompt_embeds [N, L, D], pooled [N, Dp]) through the pipeline's own encode_prompt.

    No CFG (guidance 1.0, docs/algorithm.md §2): only the positive branch is computed. L is
    77 CLIP tokens + `max_sequence_length` T5 tokens.
    """
    prompts = list(prompts)
    device = next(pipe.transformer.parameters()).device
    embeds, _, pooled, _ = pipe.encode_prompt(
        prompt=prompts, prompt_2=prompts, prompt_3=prompts, device=device,
        num_images_per_prompt=1, do_classifier_free_guidance=False,
        max_sequence_length=max_sequence_length)
    return embeds, pooled


def timestep_from_sigma(sigma: Tensor | float, batch: int, integer_timestep: bool,
                        device=None) -> Tensor:
    """The transformer's timestep: sigma * 1000, truncated to an integer when sampling.

    The reference feeds int(sigma*1000) during rollouts and the float scheduler value
    during training (docs/algorithm.md §2); `integer_timestep` selects which.
    """
    sigma = torch.as_tensor(sigma, dtype=torch.float32, device=device)
    timestep = sigma * 1000.0
    if integer_timestep:
        timestep = timestep.long().float()
    return timestep.expand(batch) if timestep.ndim == 0 else timestep.reshape(batch)


def velocity(transformer, x_t: Tensor, sigma: Tensor | float, prompt_embeds: Tensor,
             pooled: Tensor, integer_timestep: bool = False) -> Tensor:
    """v(x_t, sigma) of the flow x_t = (1 - sigma) x0 + sigma * eps (so v ~ eps - x0).

    `sigma` is a scalar or a [B] tensor. The output has x_t's shape; it is cast back
    to x_t's dtype (the transformer may run in bf16/fp16). The timestep stays fp32 (the
    reference feeds its fp32 scheduler timesteps; sigma*1000 in fp16 would round to 0.5).
    """
    batch = x_t.shape[0]
    timestep = timestep_from_sigma(sigma, batch, integer_timestep, device=x_t.device)
    model_dtype = next(transformer.parameters()).dtype
    out = transformer(
        hidden_states=x_t.to(model_dtype), timestep=timestep,
        encoder_hidden_states=prompt_embeds.to(model_dtype),
        pooled_projections=pooled.to(model_dtype), return_dict=False)[0]
    return out.to(x_t.dtype)


@torch.no_grad()
def decode_latents(pipe, latents: Tensor) -> Tensor:
    """Images [N, 3, H, W] float32 in [0, 1] on the CPU from x0 latents (VAE weights in fp32,
    docs/algorithm.md §10; training rollouts call it under the run's autocast, as the reference).

    The one decode of training, rollouts and evaluation; evaluation then quantises to
    8 bits as a separate step (`marble.evaluation.images.quantize_8bit`).
    """
    vae = pipe.vae
    cfg = vae.config
    vae_device = next(vae.parameters()).device
    # Undo SD3's latent normalisation: z = (x - shift) * scale at encode time.
    z = latents.to(device=vae_device, dtype=torch.float32) / cfg.scaling_factor + cfg.shift_factor
    images = vae.decode(z, return_dict=False)[0]
    return ((images + 1.0) / 2.0).clamp(0.0, 1.0).float().cpu()


def latent_shape(pipe, resolution: int) -> tuple[int, int, int]:
    """(C, h, w) of the latent of a `resolution` x `resolution` image."""
    factor = 2 ** (len(pipe.vae.config.block_out_channels) - 1)
    if resolution % (factor * pipe.transformer.config.patch_size):
        raise ValueError(f"resolution {resolution} must be a multiple of "
                         f"{factor * pipe.transformer.config.patch_size} (VAE x{factor}, patch "
                         f"{pipe.transformer.config.patch_size})")
    side = resolution // factor
    return (pipe.transformer.config.in_channels, side, side)
