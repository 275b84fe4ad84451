"""Random-init replica of HPSv2.1's open_clip checkpoint (`HPS_v2.1_compressed.pt`), in the
state-dict layout hpsv2 saves: the tiny ViT-H-14-shaped model the mirror serves (its open_clip
config written beside it, as files cannot name an architecture) and, with `size="ViT-H-14"`,
open_clip's real architecture for the gpu check's score phase. Split from
tests/beds/replicas.py, whose `write_config_json` and `CLIP_IMAGE` it shares.
"""

from __future__ import annotations

from pathlib import Path

import torch

from beds.replicas import CLIP_IMAGE, write_config_json

HPS_WIDTH, HPS_EMBED, HPS_LAYERS = 32, 16, 2
OPEN_CLIP_VOCAB, OPEN_CLIP_CONTEXT = 49408, 77  # open_clip's SimpleTokenizer


def _fill(value: float, n: int, device) -> torch.Tensor:
    return torch.full((n,), float(value), device=device)


def _resblocks(prefix: str, width: int, layers: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """open_clip ResidualAttentionBlock parameters (nn.MultiheadAttention + c_fc/c_proj MLP)."""
    def rnd(*shape):
        return torch.randn(*shape, generator=g, device=g.device) * 0.02

    def const(fill, n):
        return _fill(fill, n, g.device)

    sd = {}
    for i in range(layers):
        b = f"{prefix}.resblocks.{i}."
        sd.update({b + "ln_1.weight": const(1, width), b + "ln_1.bias": const(0, width),
                   b + "attn.in_proj_weight": rnd(3 * width, width), b + "attn.in_proj_bias": const(0, 3 * width),
                   b + "attn.out_proj.weight": rnd(width, width), b + "attn.out_proj.bias": const(0, width),
                   b + "ln_2.weight": const(1, width), b + "ln_2.bias": const(0, width),
                   b + "mlp.c_fc.weight": rnd(4 * width, width), b + "mlp.c_fc.bias": const(0, 4 * width),
                   b + "mlp.c_proj.weight": rnd(width, 4 * width), b + "mlp.c_proj.bias": const(0, width)})
    return sd


# open_clip's own ViT-H-14 config (model_configs/ViT-H-14.json): HPSv2.1's architecture.
OPEN_CLIP_VIT_H14 = {"embed_dim": 1024,
                     "vision_cfg": {"image_size": 224, "layers": 32, "width": 1280, "head_width": 80, "patch_size": 14},
                     "text_cfg": {"context_length": OPEN_CLIP_CONTEXT, "vocab_size": OPEN_CLIP_VOCAB, "width": 1024,
                                  "heads": 16, "layers": 24}}


def hps_state_dict(seed: int = 0, config: dict | None = None, device: str = "cpu") -> dict[str, torch.Tensor]:
    """An open_clip CLIP state dict for `config` (default `hps_config()`; the keys
    HPS_v2.1_compressed.pt holds), drawn on `device` and returned on the CPU."""
    cfg = config or hps_config()
    vis, txt, e = cfg["vision_cfg"], cfg["text_cfg"], cfg["embed_dim"]
    vw, tw, patch = vis["width"], txt["width"], vis["patch_size"]
    g = torch.Generator(device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device)

    def const(fill, n):
        return _fill(fill, n, device)

    sd = {"positional_embedding": randn(txt["context_length"], tw) * 0.01,
          "text_projection": randn(tw, e) * tw**-0.5,
          "logit_scale": torch.tensor(4.6052, device=device),
          "token_embedding.weight": randn(txt["vocab_size"], tw) * 0.02,
          "ln_final.weight": const(1, tw), "ln_final.bias": const(0, tw),
          "visual.class_embedding": randn(vw) * vw**-0.5,
          "visual.positional_embedding": randn((vis["image_size"] // patch) ** 2 + 1, vw) * vw**-0.5,
          "visual.proj": randn(vw, e) * vw**-0.5,
          "visual.conv1.weight": randn(vw, 3, patch, patch) * 0.02,
          "visual.ln_pre.weight": const(1, vw), "visual.ln_pre.bias": const(0, vw),
          "visual.ln_post.weight": const(1, vw), "visual.ln_post.bias": const(0, vw)}
    sd.update(_resblocks("transformer", tw, txt["layers"], g))
    sd.update(_resblocks("visual.transformer", vw, vis["layers"], g))
    return {k: v.cpu() for k, v in sd.items()}


def hps_config() -> dict:
    """open_clip model config of the HPS replica (a ViT-H-14 shape, tiny widths)."""
    return {"embed_dim": HPS_EMBED,
            "vision_cfg": {"image_size": CLIP_IMAGE, "layers": HPS_LAYERS, "width": HPS_WIDTH, "head_width": 16,
                           "patch_size": 8},
            "text_cfg": {"context_length": OPEN_CLIP_CONTEXT, "vocab_size": OPEN_CLIP_VOCAB, "width": HPS_WIDTH,
                         "heads": 2, "layers": HPS_LAYERS}}


def write_hps_config(path: Path) -> None:
    write_config_json(path, hps_config())


def hps_repo(folder: Path, seed: int = 0, size: str = "tiny", device: str = "cpu") -> None:
    """HPS_v2.1_compressed.pt; `size` "ViT-H-14" is open_clip's built-in architecture of that name."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"tiny": None, "ViT-H-14": OPEN_CLIP_VIT_H14}[size]
    # as hpsv2 saves it
    torch.save({"state_dict": hps_state_dict(seed, config, device)}, folder / "HPS_v2.1_compressed.pt")
