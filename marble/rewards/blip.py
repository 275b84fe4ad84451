"""ImageReward v1.0 on transformers' BLIP modules, loaded from the package's own files.

Why not the `image-reward` package: in a current install it does not import (OpenAI `clip`
is a git dependency, it needs `pkg_resources`, timm 0.6 and a torchvision matching torch,
and its `med.py` imports helpers transformers 5 removed). Its model is BLIP's ViT (timm
layout) + BLIP's BERT-MED text encoder with cross-attention to the image + a 5-layer
linear head; transformers ships the same BLIP modules (`BlipVisionModel`,
`BlipTextModel`, ported from the same salesforce code), so this file only maps the
checkpoint's parameter names onto them and reproduces `ImageReward.score`:

    features = text_encoder(tokens(prompt, max_length=35), cross-attending image patches)[:, 0]
    reward = (mlp(features) - 0.16717362830052426) / 1.0333394966054072

Files, all local (no hub access): `ImageReward.pt` (the state dict), `med_config.json`
(the BERT config) and a BERT tokenizer folder (`bert-base-uncased`, saved with
`save_pretrained` or downloaded as is). The vision tower's width, depth, patch and image
size are read from the checkpoint's shapes (ViT-L/16 at 224 for the real one).
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import numpy as np
import torch
from torch import nn

from marble.rewards.base import CLIP_MEAN, CLIP_STD

MEAN, STD = 0.16717362830052426, 1.0333394966054072  # ImageReward's reward normalisation
MAX_TOKENS = 35
HEAD_DIM = 64  # BLIP's ViTs use 64-dim heads (ViT-L: 1024/16, ViT-B: 768/12)
log = logging.getLogger(__name__)

# checkpoint name (regex) -> name in our modules; applied to keys under "blip.visual_encoder."
_VISION_KEYS = [
    (r"^cls_token$", "embeddings.class_embedding"),
    (r"^pos_embed$", "embeddings.position_embedding"),
    (r"^patch_embed\.proj\.", "embeddings.patch_embedding."),
    (r"^blocks\.(\d+)\.norm1\.", r"encoder.layers.\1.layer_norm1."),
    (r"^blocks\.(\d+)\.norm2\.", r"encoder.layers.\1.layer_norm2."),
    (r"^blocks\.(\d+)\.attn\.qkv\.", r"encoder.layers.\1.self_attn.qkv."),
    (r"^blocks\.(\d+)\.attn\.proj\.", r"encoder.layers.\1.self_attn.projection."),
    (r"^blocks\.(\d+)\.mlp\.", r"encoder.layers.\1.mlp."),
    (r"^norm\.", "post_layernorm."),
]


def _vision_name(key: str) -> str:
    for pattern, repl in _VISION_KEYS:
        new, n = re.subn(pattern, repl, key)
        if n:
            return new
    raise KeyError(f"imagereward: unexpected vision parameter {key!r} in the checkpoint")


def map_state_dict(state: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """Split ImageReward.pt's keys into {visual, text, mlp} state dicts with our names.

    Parts the score does not use are dropped: BLIP's contrastive projections and
    position-id buffers silently, any other top-level entry (e.g. training-time extras)
    with a warning naming it, as image-reward's own `load_state_dict(strict=False)` would
    ignore it. An unknown name inside the vision tower is an error, and so (at load) is a
    missing one.
    """
    out: dict[str, dict[str, torch.Tensor]] = {"visual": {}, "text": {}, "mlp": {}}
    ignored = []
    for key, value in state.items():
        if key.startswith("blip.visual_encoder."):
            out["visual"][_vision_name(key[len("blip.visual_encoder."):])] = value
        elif key.startswith("blip.text_encoder."):
            name = key[len("blip.text_encoder."):]
            if not name.endswith("position_ids"):
                out["text"][name] = value
        elif key.startswith("mlp.layers."):
            out["mlp"][key[len("mlp."):]] = value
        elif not key.startswith(("blip.vision_proj.", "blip.text_proj.")):
            ignored.append(key)
    if ignored:
        log.warning("imagereward: ignoring %d checkpoint entries the score does not use: %s",
                    len(ignored), ", ".join(ignored[:8]))
    return out


def vision_config(visual: dict[str, torch.Tensor], heads: int | None = None):
    from transformers import BlipVisionConfig

    width = visual["embeddings.class_embedding"].shape[-1]
    patch = visual["embeddings.patch_embedding.weight"].shape[-1]
    grid = int(round((visual["embeddings.position_embedding"].shape[1] - 1) ** 0.5))
    depth = 1 + max(int(k.split(".")[2]) for k in visual if k.startswith("encoder.layers."))
    return BlipVisionConfig(
        hidden_size=width, intermediate_size=visual["encoder.layers.0.mlp.fc1.weight"].shape[0],
        num_hidden_layers=depth, num_attention_heads=heads or max(1, width // HEAD_DIM),
        image_size=grid * patch, patch_size=patch, hidden_act="gelu",
        layer_norm_eps=1e-6,  # timm's ViT in BLIP
    )


def text_config(med_config: dict, encoder_width: int):
    from transformers import BlipTextConfig

    if not med_config.get("add_cross_attention", False):
        raise ValueError("imagereward: med_config.json must set add_cross_attention (BLIP's MED encoder)")
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "max_position_embeddings", "layer_norm_eps", "hidden_act", "pad_token_id")
    missing = [k for k in keys if k not in med_config]
    if missing:
        raise ValueError(f"imagereward: med_config.json lacks {missing}")
    # is_decoder builds the cross-attention layers; the forward passes is_decoder=False
    # (bidirectional self-attention), as BLIP's multimodal encoder mode does.
    return BlipTextConfig(**{k: med_config[k] for k in keys}, encoder_hidden_size=encoder_width,
                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, is_decoder=True,
                          bos_token_id=None, eos_token_id=None, sep_token_id=None)  # unused when encoding


def reward_head(in_features: int) -> nn.Sequential:
    """ImageReward's MLP: Linear layers at indices 0, 2, 4, 6, 7 (dropouts between, no activations)."""
    return nn.Sequential(nn.Linear(in_features, 1024), nn.Dropout(0.2), nn.Linear(1024, 128), nn.Dropout(0.2),
                         nn.Linear(128, 64), nn.Dropout(0.1), nn.Linear(64, 16), nn.Linear(16, 1))


def preprocess(image, size: int) -> torch.Tensor:
    """torchvision's Resize(size, BICUBIC) + CenterCrop + ToTensor + CLIP Normalize on a PIL image."""
    from PIL import Image

    image = image.convert("RGB")
    w, h = image.size
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = size, int(size * long / short)  # torchvision truncates the long side
    new_w, new_h = (new_short, new_long) if w <= h else (new_long, new_short)
    image = image.resize((new_w, new_h), Image.BICUBIC)
    top, left = int(round((new_h - size) / 2.0)), int(round((new_w - size) / 2.0))
    image = image.crop((left, top, left + size, top + size))
    x = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1)
    return (x - torch.tensor(CLIP_MEAN).view(3, 1, 1)) / torch.tensor(CLIP_STD).view(3, 1, 1)


def load_tokenizer(folder: str | Path):
    """bert-base-uncased from a local folder, with BLIP's two added tokens ([DEC], [ENC])."""
    from transformers import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(str(folder), local_files_only=True)
    tokenizer.add_special_tokens({"bos_token": "[DEC]"})
    tokenizer.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    return tokenizer


class ImageRewardModel(nn.Module):
    """BLIP ViT + MED text encoder + reward head, scoring (prompt, image) pairs."""

    def __init__(self, state: dict[str, torch.Tensor], med_config: dict, tokenizer, vision_heads: int | None = None):
        super().__init__()
        from transformers import BlipTextModel, BlipVisionModel

        parts = map_state_dict(state)
        vcfg = vision_config(parts["visual"], vision_heads)
        self.visual = BlipVisionModel(vcfg)
        self.text = BlipTextModel(text_config(med_config, vcfg.hidden_size), add_pooling_layer=False)
        self.mlp = nn.Module()
        self.mlp.layers = reward_head(med_config["hidden_size"])
        for name, module in (("visual", self.visual), ("text", self.text), ("mlp", self.mlp)):
            missing, _ = module.load_state_dict(parts[name], strict=False)
            missing = [k for k in missing if not k.endswith("position_ids")]
            unexpected = set(parts[name]) - set(module.state_dict())
            if missing or unexpected:
                raise KeyError(f"imagereward: checkpoint does not fit the {name} module: missing {missing[:5]}, "
                               f"unexpected {sorted(unexpected)[:5]}")
        self.tokenizer, self.image_size = tokenizer, vcfg.image_size
        self.eval()

    @torch.no_grad()
    def score(self, prompts: list[str], images: list) -> torch.Tensor:
        """ImageReward of each (prompt_i, image_i) pair (PIL images), float32 [N]."""
        device = next(self.parameters()).device
        pixels = torch.stack([preprocess(im, self.image_size) for im in images]).to(device)
        tokens = self.tokenizer(prompts, padding="max_length", truncation=True, max_length=MAX_TOKENS,
                                return_tensors="pt").to(device)
        image_embeds = self.visual(pixel_values=pixels).last_hidden_state
        image_atts = torch.ones(image_embeds.shape[:-1], dtype=torch.long, device=device)
        out = self.text(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask,
                        encoder_hidden_states=image_embeds, encoder_attention_mask=image_atts, is_decoder=False)
        rewards = self.mlp.layers(out.last_hidden_state[:, 0, :].float())
        return ((rewards - MEAN) / STD).squeeze(-1).float().cpu()


def load_imagereward(ckpt: str | Path, med_config: str | Path, tokenizer_dir: str | Path, device: str = "cpu",
                     vision_heads: int | None = None) -> ImageRewardModel:
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    config = json.loads(Path(med_config).read_text())
    return ImageRewardModel(state, config, load_tokenizer(tokenizer_dir), vision_heads).to(device)
