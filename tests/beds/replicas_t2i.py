"""Tiny SD-XL and FLUX.1 pipelines, random-init from configs and saved by `save_pretrained`
(the diffusers folder layout their hub repos hold: model_index.json naming the pipeline class,
one subfolder per component), so the generic text-to-image path of `marble evaluate`
(`--model_type generic`) is exercised on the format a real download has. Deterministic given
the seed; widths are tiny (seconds on a CPU). Tokenizers are marble.models.tiny's (trained
offline on a tiny corpus: no network).
"""

from __future__ import annotations

from pathlib import Path

import torch

from marble.models.tiny import (
    CLIP_HIDDEN,
    T5_WIDTH,
    tiny_text_encoders,
    train_clip_tokenizer,
    train_t5_tokenizer,
)

TIME_EMBED = 8  # SD-XL's added time ids embedding width (tiny)


def _tiny_vae(latent_channels: int, scaling: float, shift: float | None):
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=latent_channels,
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 8), layers_per_block=1, norm_num_groups=1,
        scaling_factor=scaling, shift_factor=shift)


def build_sdxl(seed: int = 0):
    """A tiny StableDiffusionXLPipeline (UNet with SD-XL's text-time conditioning)."""
    from diffusers import (
        EulerDiscreteScheduler,
        StableDiffusionXLPipeline,
        UNet2DConditionModel,
    )

    clip_tok = train_clip_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        text_l, text_g, _ = tiny_text_encoders(clip_tok, train_t5_tokenizer())
        unet = UNet2DConditionModel(
            sample_size=16, in_channels=4, out_channels=4, layers_per_block=1,
            block_out_channels=(16, 32), down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), attention_head_dim=(2, 4),
            use_linear_projection=True, addition_embed_type="text_time", norm_num_groups=8,
            addition_time_embed_dim=TIME_EMBED, transformer_layers_per_block=(1, 1),
            # 6 time ids x TIME_EMBED + the pooled text width, as SD-XL's config computes it.
            projection_class_embeddings_input_dim=6 * TIME_EMBED + CLIP_HIDDEN,
            cross_attention_dim=2 * CLIP_HIDDEN)
        vae = _tiny_vae(4, 0.13025, None)  # SD-XL's VAE scaling factor
    scheduler = EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                       timestep_spacing="leading", steps_offset=1)
    from transformers import CLIPTextModel

    return StableDiffusionXLPipeline(
        vae=vae, text_encoder=CLIPTextModel(text_l.config), text_encoder_2=text_g,
        tokenizer=clip_tok, tokenizer_2=clip_tok, unet=unet, scheduler=scheduler)


def build_flux(seed: int = 0):
    """A tiny FluxPipeline (CLIP pooled + T5 sequence conditioning, packed 2x2 latents)."""
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        FluxPipeline,
        FluxTransformer2DModel,
    )
    from transformers import CLIPTextModel

    clip_tok, t5_tok = train_clip_tokenizer(), train_t5_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        text_l, _, t5 = tiny_text_encoders(clip_tok, t5_tok)
        transformer = FluxTransformer2DModel(
            patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=T5_WIDTH, pooled_projection_dim=CLIP_HIDDEN,
            axes_dims_rope=[4, 4, 8], guidance_embeds=True)  # FLUX.1-Dev is guidance-distilled
        vae = _tiny_vae(4, 0.3611, 0.1159)  # FLUX.1's VAE scaling and shift
        clip = CLIPTextModel(text_l.config)
    return FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=vae, text_encoder=clip,
                        tokenizer=clip_tok, text_encoder_2=t5, tokenizer_2=t5_tok, transformer=transformer)


def save(pipe, folder: Path) -> Path:
    pipe.save_pretrained(folder, safe_serialization=True)
    return Path(folder)


def sdxl_repo(folder: Path, seed: int = 0) -> Path:
    return save(build_sdxl(seed), folder)


def flux_repo(folder: Path, seed: int = 0) -> Path:
    return save(build_flux(seed), folder)
