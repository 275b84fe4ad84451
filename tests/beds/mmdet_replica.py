"""A tiny random Mask2Former in the reference's config and checkpoint formats (needs mmdet 2.x).

GenEval's detector is mmdet 2.x's `mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco.py` plus a
published checkpoint. This writes (a) a config that inherits that very file through mmcv's
`_base_` and overrides only widths, depths and counts, and (b) a checkpoint laid out as OpenMMLab
publishes them (`{"meta": {...}, "state_dict": ...}`), from the model that config builds,
randomly initialised from a seed. `make test-geneval-mmdet` runs the GenEval scorer on them.

    python -m beds.mmdet_replica OUT_DIR [--seed N]
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

import torch

CONFIG_NAME = "mask2former_tiny_random.py"
CKPT_NAME = "mask2former_tiny_random.pth"

# Sizes only (Swin-S: embed 96, depths [2, 2, 18, 2]; head width 256, 100 queries, 6 encoder and
# 9 decoder layers). Head width 32 keeps GroupNorm(32 groups) of the real pixel decoder valid.
TINY_OVERRIDES = """
depths = [2, 2, 2, 2]
model = dict(
    backbone=dict(embed_dims=16, depths=depths, num_heads=[1, 2, 4, 8]),
    panoptic_head=dict(
        in_channels=[16, 32, 64, 128],
        feat_channels=32,
        out_channels=32,
        num_queries=20,
        pixel_decoder=dict(
            encoder=dict(
                num_layers=1,
                transformerlayers=dict(
                    attn_cfgs=dict(embed_dims=32, num_heads=4),
                    ffn_cfgs=dict(embed_dims=32, feedforward_channels=64))),
            positional_encoding=dict(num_feats=16)),
        positional_encoding=dict(num_feats=16),
        transformer_decoder=dict(
            num_layers=2,
            transformerlayers=dict(
                attn_cfgs=dict(embed_dims=32, num_heads=4),
                ffn_cfgs=dict(embed_dims=32, feedforward_channels=64),
                feedforward_channels=64))))
"""


def write_config(out: str | os.PathLike, base: str | os.PathLike | None = None) -> Path:
    """The tiny config: `_base_` is the installed mmdet's own GenEval config (or `base`)."""
    from marble.rewards.geneval import DETECTOR_CONFIG, mmdet_config_path

    base = Path(base) if base else mmdet_config_path(DETECTOR_CONFIG)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    header = (f"# Tiny random Mask2Former for tests (beds.mmdet_replica): sizes only.\n"
              f"_base_ = [{str(base)!r}]\n")
    out.write_text(header + TINY_OVERRIDES, encoding="utf-8")
    return out


def _sharpen_classes(model, factor: float) -> None:
    """Scale the class logits so random queries give confident labels: a random init spreads
    softmax over 81 classes (~0.01 each), all under GenEval's 0.3 threshold, and nothing past
    the detector would ever run."""
    head = model.panoptic_head
    with torch.no_grad():
        head.cls_embed.weight.mul_(factor)
        head.cls_embed.bias.mul_(factor)


def write_checkpoint(config: str | os.PathLike, out: str | os.PathLike, seed: int = 0, sharpen: float = 8.0) -> Path:
    """`{"meta", "state_dict"}` as mmcv's save_checkpoint writes it (a fixed time stamp: same seed
    and file name, same bytes); meta holds what init_detector reads (CLASSES, mmdet's COCO names) and the rest
    a published mmdet 2.x checkpoint carries (versions, config text)."""
    import mmcv
    import mmdet
    from mmcv.runner.checkpoint import get_state_dict, weights_to_cpu
    from mmdet.apis import init_detector
    from mmdet.datasets import CocoDataset

    torch.manual_seed(seed)
    model = init_detector(str(config), None, device="cpu")  # backbone init_cfg dropped: no download
    logging.getLogger("mmcv").setLevel(logging.WARNING)  # init_weights logs every tensor at INFO
    model.init_weights()
    _sharpen_classes(model, sharpen)
    # The fields mmdet 2.x's training writes (train.py, CheckpointHook, save_checkpoint): all
    # plain str/int/tuple/dict, which torch.load(weights_only=True) accepts.
    meta = {"env_info": "tiny random replica", "config": Path(config).read_text(encoding="utf-8"),
            "seed": seed, "exp_name": CONFIG_NAME, "mmdet_version": mmdet.__version__,
            "CLASSES": tuple(CocoDataset.CLASSES), "epoch": 50, "iter": 0, "hook_msgs": {},
            "mmcv_version": mmcv.__version__, "time": "Thu Jan  1 00:00:00 1970"}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    torch.save({"meta": meta, "state_dict": weights_to_cpu(get_state_dict(model))}, tmp)
    os.replace(tmp, out)  # atomic: a half-written checkpoint never sits at the final path
    return out


def build(out_dir: str | os.PathLike, seed: int = 0) -> tuple[Path, Path]:
    """Config + checkpoint under `out_dir`; returns their paths."""
    out_dir = Path(out_dir)
    config = write_config(out_dir / CONFIG_NAME)
    return config, write_checkpoint(config, out_dir / CKPT_NAME, seed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    config, ckpt = build(args.out_dir, args.seed)
    print(f"{config}\n{ckpt}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
