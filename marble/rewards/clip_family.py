"""PickScore, CLIPScore and the LAION aesthetic predictor on transformers' CLIP.

Each loads `CLIPModel` + `CLIPProcessor` from a local folder or a hub id (`model=`,
`processor=`); a hub id the manifest lists is read from its downloaded folder under the
reward-checkpoint dir (`marble.assets.hub.local_model`), never fetched at run time. Scores a
batch in chunks of `batch_size`, and applies to every prompt.
"""

from __future__ import annotations

import torch
from torch import nn

from marble.assets.hub import local_model
from marble.rewards.base import Reward, require_file, to_pil
from marble.rewards.base import ckpt_dir as resolve_ckpt_dir

PICKSCORE_MODEL = "yuvalkirstain/PickScore_v1"
PICKSCORE_PROCESSOR = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"
OPENAI_L14 = "openai/clip-vit-large-patch14"
AESTHETIC_HEAD = "sac+logos+ava1-l14-linearMSE.pth"


def projected_features(out) -> torch.Tensor:
    """transformers 4 returns the projected features; 5 returns an output whose pooler_output is."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output


def load_clip(model: str, processor: str | None, device: str, ckpt_dir: str | None = None):
    """CLIP model + processor; manifest hub ids resolve to their downloaded folders (offline nodes)."""
    from transformers import CLIPModel, CLIPProcessor

    model = local_model(model, ckpt_dir)
    processor = local_model(processor, ckpt_dir) if processor else model
    clip = CLIPModel.from_pretrained(model).to(device).eval()
    return clip, CLIPProcessor.from_pretrained(processor)


class _ClipReward(Reward):
    default_model = OPENAI_L14
    default_processor: str | None = None

    def __init__(self, model: str | None = None, processor: str | None = None, device: str = "cpu",
                 batch_size: int = 32, ckpt_dir: str | None = None, **kw):
        super().__init__(**kw)
        self.device, self.batch_size = device, int(batch_size)
        self.model, self.processor = load_clip(
            model or self.default_model, processor or (None if model else self.default_processor), device, ckpt_dir
        )

    def image_embeds(self, images: torch.Tensor) -> torch.Tensor:
        inputs = self.processor(images=to_pil(images), return_tensors="pt").to(self.device)
        return nn.functional.normalize(projected_features(self.model.get_image_features(**inputs)).float(), dim=-1)

    def text_embeds(self, prompts: list[str]) -> torch.Tensor:
        max_len = self.model.config.text_config.max_position_embeddings
        inputs = self.processor(text=prompts, padding=True, truncation=True, max_length=max_len,
                                return_tensors="pt").to(self.device)
        return nn.functional.normalize(projected_features(self.model.get_text_features(**inputs)).float(), dim=-1)

    def score_chunk(self, images, prompts) -> torch.Tensor:
        raise NotImplementedError

    def score(self, images, prompts, metadata):
        chunks = [
            self.score_chunk(images[i : i + self.batch_size], prompts[i : i + self.batch_size])
            for i in range(0, len(prompts), self.batch_size)
        ]
        return torch.cat(chunks).cpu()


class PickScore(_ClipReward):
    """logit_scale * cos(text, image) / 26 (the reference's scale: ~0.8-0.92)."""

    name = "pickscore"
    default_model, default_processor = PICKSCORE_MODEL, PICKSCORE_PROCESSOR

    def score_chunk(self, images, prompts):
        cos = (self.image_embeds(images) * self.text_embeds(prompts)).sum(-1)
        return self.model.logit_scale.exp().float() * cos / 26.0


def _size(size) -> tuple[int, int] | int:
    """A processor's size entry: (height, width), or an int shortest edge."""
    if isinstance(size, int):
        return size, size
    if "height" in size and "width" in size:
        return size["height"], size["width"]
    if "shortest_edge" in size:
        return int(size["shortest_edge"])
    raise ValueError(f"clipscore: unsupported processor size {size!r}")


def clip_pixel_values(images: torch.Tensor, config: dict) -> torch.Tensor:
    """The reference CLIPScore's preprocessing (flow_grpo clip_scorer: torchvision transforms
    on the float image tensor): bilinear antialiased resize (shortest edge, or to H x W), centre
    crop, normalise, all in float; no 8-bit PIL round trip and no bicubic. `config`: the CLIP
    image processor's to_dict(). images: [N, 3, H, W] in [0, 1]."""
    x = images.float()
    if config.get("do_resize"):
        size = _size(config["size"])
        if isinstance(size, int):  # torchvision's rule: the short edge to `size`, the long floored
            h, w = x.shape[-2:]
            short, long = (h, w) if h <= w else (w, h)
            new_long = int(size * long / short)
            size = (size, new_long) if h <= w else (new_long, size)
        x = nn.functional.interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=True)
    if config.get("do_center_crop"):
        ch, cw = _size(config["crop_size"])
        h, w = x.shape[-2:]
        top, left = round((h - ch) / 2.0), round((w - cw) / 2.0)
        x = x[..., top:top + ch, left:left + cw]
    if config.get("do_normalize"):
        mean = torch.tensor(config["image_mean"], dtype=x.dtype).view(1, -1, 1, 1)
        std = torch.tensor(config["image_std"], dtype=x.dtype).view(1, -1, 1, 1)
        x = (x - mean) / std
    return x


class ClipScore(_ClipReward):
    """cos(text, image): the reference's logits/100, exact for OpenAI CLIP (logit scale 100).
    Images are preprocessed as the reference's ClipScorer does (clip_pixel_values)."""

    name = "clipscore"

    def image_embeds(self, images: torch.Tensor) -> torch.Tensor:
        pixels = clip_pixel_values(images, self.processor.image_processor.to_dict()).to(self.device)
        features = projected_features(self.model.get_image_features(pixel_values=pixels))
        return nn.functional.normalize(features.float(), dim=-1)

    def score_chunk(self, images, prompts):
        return (self.image_embeds(images) * self.text_embeds(prompts)).sum(-1)


class AestheticMLP(nn.Module):
    """The LAION improved-aesthetic-predictor head (layer indices match its state dict)."""

    def __init__(self, input_dim: int = 768):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(input_dim, 1024), nn.Dropout(0.2), nn.Linear(1024, 128), nn.Dropout(0.2),
            nn.Linear(128, 64), nn.Dropout(0.1), nn.Linear(64, 16), nn.Linear(16, 1),
        )

    def forward(self, embeds: torch.Tensor) -> torch.Tensor:
        return self.layers(embeds)


def load_aesthetic_head(path) -> AestheticMLP:
    state = torch.load(path, map_location="cpu", weights_only=True)
    state = state.get("state_dict", state)
    if "layers.0.weight" not in state:
        raise ValueError(f"{path}: not an aesthetic MLP state dict (no 'layers.0.weight'; keys {sorted(state)[:5]})")
    head = AestheticMLP(state["layers.0.weight"].shape[1])
    head.load_state_dict(state)
    return head.eval()


class Aesthetic(_ClipReward):
    """LAION aesthetic score (~1-10, raw) from the L2-normalised CLIP ViT-L/14 image embedding."""

    name = "aesthetic"

    def __init__(self, head: str | None = None, ckpt_dir: str | None = None, **kw):
        folder = resolve_ckpt_dir(ckpt_dir)
        head_path = require_file(self.name, head or AESTHETIC_HEAD, folder)
        super().__init__(ckpt_dir=ckpt_dir, **kw)
        self.head = load_aesthetic_head(head_path).to(self.device)
        dim = self.model.config.projection_dim
        if self.head.layers[0].in_features != dim:
            raise ValueError(f"{head_path}: head expects {self.head.layers[0].in_features}-d embeddings, "
                             f"CLIP gives {dim}")

    def score_chunk(self, images, prompts):
        return self.head(self.image_embeds(images)).squeeze(-1)

