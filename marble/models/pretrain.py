"""Teach the tiny generator to draw: a short, deterministic pretraining stage.

A random-init tiny SD3 draws near-uniform grey (its VAE decoder barely responds to the
latents), so RL fine-tuning on it moves the toy rewards by ~1e-3. This stage first fits
the VAE as an autoencoder, then the transformer by flow matching, on synthetic pictures
drawn from each training prompt (`draw_toy_image`): a background whose colour follows
the prompt (the named colour for GenEval-style colour records), a disc, and for prompts
with quoted text a band of dark/light bars. Brightness, saturation, bar contrast and the
mix with the named colour vary from picture to picture, so the pretrained model samples
a spread of images per prompt: the within-group variance the RL advantages need, and
headroom in every toy reward.

Pure functions of (prompts, seed, settings): the same inputs give the same model.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch

from marble.maths.flow import forward_process
from marble.models.encode import encode_prompts, velocity
from marble.models.loading import load_pipeline
from marble.rewards.base import quoted_target
from marble.rewards.toy import GENEVAL_COLORS, first_named_color
from marble.runtime.io import atomic_path, write_json
from marble.runtime.seeds import SEED_BITS, STREAM_PRETRAIN, keyed_generator, stable_seed


@dataclass(frozen=True)
class PretrainSettings:
    vae_steps: int = 200
    flow_steps: int = 400
    batch_size: int = 16
    vae_lr: float = 5e-3
    chroma_weight: float = 4.0
    flow_lr: float = 1e-3
    resolution: int = 64  # of the pictures the flow stage learns (the rollouts' size)
    vae_resolution: int = 32  # the VAE is convolutional: fit it on cheaper small pictures
    max_sequence_length: int = 32
    pictures: int = 1024  # distinct synthetic pictures the flow stage learns from
    seed: int = 0


def prompt_hue(prompt: str) -> float:
    """A stable hue in [0, 1) from the prompt text (marble's seed scheme, not Python's salted
    hash)."""
    return stable_seed("pretrain_hue", prompt) / 2**SEED_BITS


def hsv_to_rgb(h: float, s: float, v: float) -> torch.Tensor:
    """[3] RGB in [0, 1] of one HSV colour (h wraps around)."""
    h = (h % 1.0) * 6.0
    i, f = int(h) % 6, h - int(h)
    p, q, t = v * (1 - s), v * (1 - s * f), v * (1 - s * (1 - f))
    rgb = [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)][i]
    return torch.tensor(rgb, dtype=torch.float32)


def _u(gen: torch.Generator, lo: float, hi: float) -> float:
    return lo + (hi - lo) * float(torch.rand((), generator=gen))


def draw_toy_image(prompt: str, metadata: dict, gen: torch.Generator, size: int = 64) -> torch.Tensor:
    """One synthetic picture [3, size, size] in [0, 1] for a prompt; `gen` draws its variation."""
    ys, xs = torch.meshgrid(torch.linspace(0, 1, size), torch.linspace(0, 1, size), indexing="ij")
    hue = prompt_hue(prompt)
    bg = hsv_to_rgb(hue + _u(gen, -0.05, 0.05), _u(gen, 0.1, 0.9), _u(gen, 0.2, 0.9))
    color = first_named_color(metadata)
    if color in GENEVAL_COLORS:  # partly the named colour: color_match has room both ways
        named = torch.tensor(GENEVAL_COLORS[color], dtype=torch.float32) / 255.0
        w = _u(gen, 0.2, 0.7)
        bg = w * named + (1 - w) * bg
    img = bg.view(3, 1, 1).expand(3, size, size).clone()
    # A soft disc in a second colour (soft edges: smooth in the latents).
    cx, cy, r = _u(gen, 0.3, 0.7), _u(gen, 0.3, 0.7), _u(gen, 0.12, 0.28)
    disc = torch.sigmoid((r - ((xs - cx) ** 2 + (ys - cy) ** 2).sqrt()) / 0.03)
    obj = hsv_to_rgb(hue + 0.5 + _u(gen, -0.1, 0.1), _u(gen, 0.2, 1.0), _u(gen, 0.2, 1.0))
    img = img * (1 - disc) + obj.view(3, 1, 1) * disc
    target = quoted_target(prompt)
    if target:  # "text": a band of dark/light bars whose contrast varies
        bars = (torch.sin(2 * math.pi * (2 + len(target) % 2) * xs) > 0).float()
        band = ((ys > 0.62) & (ys < 0.88)).float() * _u(gen, 0.1, 0.9)
        img = img * (1 - band) + bars * band
    return img.clamp(0, 1)


def picture_set(records: list[tuple[str, dict]], n: int, seed: int, size: int,
                purpose: str = "flow"):
    """(images [n, 3, size, size], record index [n]): record i % len, variation keyed by
    (seed, purpose, i) through marble's one seed scheme (the VAE's and the flow's picture
    sets are distinct draws of one seed, and no two seeds share a picture)."""
    images, index = [], []
    for i in range(n):
        gen = keyed_generator(seed, STREAM_PRETRAIN, f"picture_{purpose}", i)
        k = i % len(records)
        images.append(draw_toy_image(*records[k], gen, size))
        index.append(k)
    return torch.stack(images), torch.tensor(index)


def train_vae(vae, images: torch.Tensor, s: PretrainSettings) -> list[float]:
    """Fit the VAE as an autoencoder (posterior mode, MSE); returns the loss per step."""
    gen = keyed_generator(s.seed, STREAM_PRETRAIN, "vae_batches")
    vae.requires_grad_(True).train()  # loaded pipelines come frozen
    opt = torch.optim.Adam(vae.parameters(), lr=s.vae_lr)
    losses = []
    for _ in range(s.vae_steps):
        batch = images[torch.randint(len(images), (s.batch_size,), generator=gen)] * 2 - 1
        z = vae.encode(batch).latent_dist.mode()
        recon = vae.decode(z).sample
        # Colour is learnt last (luma dominates the MSE): weight the chroma error up, so
        # the decoder can draw saturated colours within a short budget. A light pull of
        # the latents towards unit scale keeps them well conditioned.
        err = recon - batch
        chroma = err - err.mean(dim=1, keepdim=True)
        loss = err.pow(2).mean() + s.chroma_weight * chroma.pow(2).mean() + 1e-3 * z.pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    vae.requires_grad_(False).eval()
    return losses


@torch.no_grad()
def normalise_latents(vae, images: torch.Tensor) -> torch.Tensor:
    """Encode, then set the VAE's shift/scale so the latents are zero-mean, unit-std (as SD3's)."""
    z = torch.cat([vae.encode(images[i:i + 64] * 2 - 1).latent_dist.mode()
                   for i in range(0, len(images), 64)])
    shift, scale = float(z.mean()), 1.0 / float(z.std())
    vae.register_to_config(shift_factor=shift, scaling_factor=scale)
    return (z - shift) * scale


def train_flow(transformer, latents, embeds, pooled, index, s: PretrainSettings) -> list[float]:
    """Flow matching x_t = (1 - sigma) x0 + sigma eps, target eps - x0, SD3's shift-3 sigmas."""
    gen = keyed_generator(s.seed, STREAM_PRETRAIN, "flow_draws")
    transformer.requires_grad_(True).train()
    opt = torch.optim.AdamW(transformer.parameters(), lr=s.flow_lr, weight_decay=0.0)
    losses = []
    for _ in range(s.flow_steps):
        pick = torch.randint(len(latents), (s.batch_size,), generator=gen)
        x0, rec = latents[pick], index[pick]
        eps = torch.randn(x0.shape, generator=gen)
        u = torch.rand((s.batch_size,), generator=gen)
        sigma = 3 * u / (1 + 2 * u)  # the scheduler's shift 3: more time at high noise
        v = velocity(transformer, forward_process(x0, eps, sigma), sigma, embeds[rec], pooled[rec])
        loss = torch.nn.functional.mse_loss(v, eps - x0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(transformer.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
    transformer.requires_grad_(False).eval()
    return losses


def pretrain(model_dir: str | Path, records: Sequence[tuple[str, dict]], out: str | Path,
             s: PretrainSettings = PretrainSettings()) -> dict:
    """Pretrain the tiny pipeline at `model_dir` on (prompt, metadata) `records`; save to `out`.

    The records come from an assembled table (`marble models pretrain --table`): reading the
    table is the data layer's job, so this module does not import it."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(stable_seed(s.seed, STREAM_PRETRAIN, "init"))  # the global RNG: inits
        pipe = load_pipeline(str(model_dir))
        records = list(records)
        if not records:
            raise ValueError("no prompts to pretrain on")
        small, _ = picture_set(records, s.pictures, s.seed, s.vae_resolution, "vae")
        vae_losses = train_vae(pipe.vae, small, s)
        images, index = picture_set(records, s.pictures, s.seed, s.resolution)
        latents = normalise_latents(pipe.vae, images)
        embeds, pooled = encode_prompts(pipe, [p for p, _ in records], s.max_sequence_length)
        flow_losses = train_flow(pipe.transformer, latents, embeds, pooled, index, s)
    summary = {
        "settings": asdict(s), "prompts": len(records),
        "vae_loss": {"first": vae_losses[0], "last": _tail_mean(vae_losses)} if vae_losses else None,
        "flow_loss": {"first": flow_losses[0], "last": _tail_mean(flow_losses)} if flow_losses else None,
    }
    with atomic_path(Path(out)) as tmp:
        pipe.save_pretrained(tmp, safe_serialization=True)
        write_json(Path(tmp) / "pretrain_summary.json", summary)
    return summary


def _tail_mean(values: list[float], n: int = 20) -> float:
    tail = values[-n:]
    return sum(tail) / len(tail)
