"""HPSv2.1: open_clip ViT-H-14 fine-tuned on human preferences; score = cos(image, text).

open_clip needs torchvision, which must match the installed torch build (see
docs/rewards.md); both are imported only when this reward is built.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from marble.rewards.base import CLIP_MEAN, CLIP_STD, Reward, require_file
from marble.rewards.base import ckpt_dir as resolve_ckpt_dir
from marble.runtime import install

HPS_CKPT = "HPS_v2.1_compressed.pt"


def import_open_clip():
    try:
        import open_clip
    except ImportError as err:
        raise ImportError(
            f"hpsv2 needs open_clip and a torchvision matching torch: first the pair "
            f"(`{install.torchvision(torch.__version__)}`), then `{install.extra('clip')}` "
            "(docs/rewards.md; on CI's CPU torch: `make` builds the clip venv)"
        ) from err
    return open_clip


def clip_preprocess(images: torch.Tensor, size: int) -> torch.Tensor:
    """HPSv2's validation transform on [N,3,H,W] floats in [0,1], as the reference applies it to
    its float rollouts: bicubic (antialiased) resize of the *long* side to `size` (rounded),
    zero padding to a square (left/top get the smaller half), CLIP normalisation. No clamp
    after the resize: torchvision does not clamp float images, so overshoot is kept."""
    h, w = images.shape[-2:]
    scale = size / max(h, w)
    x = images.float()
    if scale != 1.0:
        new_h, new_w = round(h * scale), round(w * scale)
        x = F.interpolate(x, size=(new_h, new_w), mode="bicubic", align_corners=False, antialias=True)
        pad_h, pad_w = size - new_h, size - new_w
        x = F.pad(x, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2), value=0.0)
    mean = torch.tensor(CLIP_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CLIP_STD).view(1, 3, 1, 1)
    return (x - mean) / std


def load_state_dict(path) -> dict:
    state = torch.load(path, map_location="cpu", weights_only=True)
    return state.get("state_dict", state) if isinstance(state, dict) else state


class HPSv2(Reward):
    """Applies to every prompt. Options: `hps_ckpt` (full model weights), `clip_ckpt` (optional
    initial CLIP weights, the reference's laion ViT-H-14 `.bin`; the HPS checkpoint overrides
    them all), `arch` and `model_config` (a JSON of a custom open_clip architecture)."""

    name = "hpsv2"

    def __init__(self, hps_ckpt: str | None = None, clip_ckpt: str | None = None, arch: str = "ViT-H-14",
                 model_config: str | None = None, ckpt_dir: str | None = None, device: str = "cpu",
                 batch_size: int = 32, **kw):
        super().__init__(**kw)
        folder = resolve_ckpt_dir(ckpt_dir)
        hps_path = require_file(self.name, hps_ckpt or HPS_CKPT, folder)
        clip_path = require_file(self.name, clip_ckpt, folder) if clip_ckpt else None
        open_clip = import_open_clip()
        if model_config:
            open_clip.add_model_config(model_config)
        model = open_clip.create_model(arch, pretrained=str(clip_path) if clip_path else None, device="cpu",
                                       output_dict=True)
        model.load_state_dict(load_state_dict(hps_path))
        self.model = model.to(device).eval()
        self.tokenizer = open_clip.get_tokenizer(arch)
        self.device, self.batch_size = device, int(batch_size)
        size = self.model.visual.image_size
        self.image_size = size[0] if isinstance(size, (tuple, list)) else int(size)

    def score(self, images, prompts, metadata):
        out = []
        for i in range(0, len(prompts), self.batch_size):
            pixels = clip_preprocess(images[i : i + self.batch_size], self.image_size).to(self.device)
            tokens = self.tokenizer(prompts[i : i + self.batch_size]).to(self.device)
            feats = self.model(pixels, tokens)  # normalised features
            out.append((feats["image_features"] * feats["text_features"]).sum(-1).float().cpu())
        return torch.cat(out)
