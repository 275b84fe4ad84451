"""Evaluation images on disk: 8-bit quantisation, the file formats, `image_prompts.json`.

Layout (the reference's `evaluation.py`): `OUT/images/<sample_id:05d>.<ext>` and
`OUT/image_prompts.json` mapping each image file name to {prompt, scores}.

Formats:
- `jpg` (default, as the reference: PIL's default JPEG quality 75), so the reference's
  image folders can be rescored with `--skip_generation` and ours read by its scripts.
  JPEG is lossy: scores rescored from the files differ slightly from the scores of the
  in-memory images a direct run computes.
- `png`: lossless. Scores from memory and from the files are then identical, because
  evaluation scores the 8-bit image (`quantize_8bit`) that it saves.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Iterable

import numpy as np
import torch
from PIL import Image

from marble.runtime.io import sha256_file, write_bytes, write_text

IMAGE_FORMATS = ("jpg", "png")
DEFAULT_IMAGE_FORMAT = "jpg"
JPEG_QUALITY = 75  # PIL's default, which the reference's `pil_image.save(path)` uses
IMAGE_PROMPTS_FILE = "image_prompts.json"
_PIL_FORMAT = {"jpg": "JPEG", "png": "PNG"}


def image_name(sample_id: int, fmt: str) -> str:
    if fmt not in IMAGE_FORMATS:
        raise ValueError(f"image format {fmt!r}: choose from {', '.join(IMAGE_FORMATS)}")
    return f"{sample_id:05d}.{fmt}"


def image_path(output_dir: str | Path, sample_id: int, fmt: str) -> Path:
    return Path(output_dir) / "images" / image_name(sample_id, fmt)


def quantize_8bit(images: torch.Tensor) -> torch.Tensor:
    """Float images in [0, 1] -> the nearest of the 256 levels a saved image holds.

    Evaluation scores these, so a lossless file reloads to exactly the scored values.
    """
    return torch.round(images.float().clamp(0, 1) * 255) / 255


def to_uint8_arrays(images: torch.Tensor) -> np.ndarray:
    """[N, 3, H, W] floats in [0, 1] -> [N, H, W, 3] uint8 (rounded)."""
    return (images.float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()


def encode_image(array: np.ndarray, fmt: str) -> bytes:
    buffer = io.BytesIO()
    options = {"quality": JPEG_QUALITY} if fmt == "jpg" else {}
    Image.fromarray(array).save(buffer, format=_PIL_FORMAT[fmt], **options)
    return buffer.getvalue()


def save_images(images: torch.Tensor, sample_ids: Iterable[int], output_dir: str | Path,
                fmt: str) -> dict[int, str]:
    """Write each image; returns sample_id -> sha256 of the bytes written (the results row
    records it, so a resume reuses the file only while it still holds this image)."""
    digests = {}
    for array, sample_id in zip(to_uint8_arrays(images), sample_ids):
        data = encode_image(array, fmt)
        write_bytes(image_path(output_dir, sample_id, fmt), data)
        digests[sample_id] = hashlib.sha256(data).hexdigest()
    return digests


def file_digests(sample_ids: Iterable[int], output_dir: str | Path, fmt: str) -> dict[int, str | None]:
    """sample_id -> sha256 of its saved image file (None where there is none)."""
    paths = {i: image_path(output_dir, i, fmt) for i in sample_ids}
    return {i: sha256_file(path) if path.is_file() else None for i, path in paths.items()}


class ImageDecodeError(ValueError):
    """A saved image that cannot be decoded; the message names the file."""


def load_images(sample_ids: Iterable[int], output_dir: str | Path, fmt: str) -> torch.Tensor:
    """The saved images of `sample_ids` as [N, 3, H, W] floats in [0, 1] (missing or corrupt:
    an error naming the file)."""
    tensors = []
    for sample_id in sample_ids:
        path = image_path(output_dir, sample_id, fmt)
        if not path.is_file():
            raise FileNotFoundError(
                f"--skip_generation: image {path} of sample {sample_id} is missing "
                f"(--image_format {fmt}; the reference writes .jpg)")
        try:
            with Image.open(path) as image:
                array = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
        except (OSError, ValueError, SyntaxError) as exc:  # PIL's decoders raise all three
            raise ImageDecodeError(f"image {path} of sample {sample_id} cannot be decoded ({exc}); "
                                   "delete it to regenerate, or drop --skip_generation") from None
        tensors.append(torch.from_numpy(array).permute(2, 0, 1))
    return torch.stack(tensors)


def image_prompts(rows: Iterable[dict], fmt: str) -> dict[str, dict]:
    """The reference's `image_prompts.json`: image file name -> {prompt, scores}, by sample id."""
    return {image_name(r["sample_id"], fmt): {"prompt": r["prompt"], "scores": r.get("scores") or {}}
            for r in sorted(rows, key=lambda r: r["sample_id"])}


def write_image_prompts(output_dir: str | Path, rows: Iterable[dict], fmt: str) -> Path:
    path = Path(output_dir) / IMAGE_PROMPTS_FILE
    # ensure_ascii=False and indent 2 as the reference writes it; NaN is already null in rows.
    write_text(path, json.dumps(image_prompts(rows, fmt), indent=2, ensure_ascii=False) + "\n")
    return path
