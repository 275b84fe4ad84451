"""PaddleOCR's English models (the reference's `PaddleOCR(lang="en")`: en PP-OCRv3 det, en
PP-OCRv4 rec, the mobile v2.0 angle classifier it loads even with use_angle_cls=False), read
from the reward-checkpoint folder so compute nodes need no network.

`marble download rewards` fetches the three tars (the manifest's `paddleocr/` entries) on the
login node; the first use extracts each into `<ckpt>/paddleocr/<name>/` (atomically: a
half-extracted folder is never taken for a model), and the engine gets the folders as
det/rec/cls_model_dir, so PaddleOCR never downloads into ~/.paddleocr.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
from pathlib import Path

from marble.rewards.base import DOWNLOAD_HINT

FOLDER = "paddleocr"
# PaddleOCR 2.x's defaults for lang="en" (its MODEL_URLS), by the argument that names each.
MODELS = {"det_model_dir": "en_PP-OCRv3_det_infer", "rec_model_dir": "en_PP-OCRv4_rec_infer",
          "cls_model_dir": "ch_ppocr_mobile_v2.0_cls_infer"}
WEIGHTS = "inference.pdiparams"


def _extract(tar_path: Path, name: str, dest: Path) -> None:
    """Extract the tar's `name/` folder to `dest` (staged in a sibling temp dir, then renamed)."""
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=dest.parent))
    try:
        with tarfile.open(tar_path) as tar:
            tar.extractall(staging, filter="data")  # no absolute paths, links or devices
        inner = staging / name
        if not (inner / WEIGHTS).is_file():
            raise FileNotFoundError(f"{tar_path}: no {name}/{WEIGHTS} inside; not PaddleOCR's model tar")
        os.replace(inner, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def model_dirs(ckpt_dir: str | os.PathLike) -> dict[str, str]:
    """{det_model_dir, rec_model_dir, cls_model_dir} under `<ckpt_dir>/paddleocr/`, extracting
    each downloaded tar on first use; a clear error naming the download when one is missing."""
    root = Path(ckpt_dir) / FOLDER
    out = {}
    for arg, name in MODELS.items():
        folder = root / name
        if not (folder / WEIGHTS).is_file():
            tar_path = root / f"{name}.tar"
            if not tar_path.is_file():
                raise FileNotFoundError(
                    f"ocr backend 'paddle': {tar_path} is missing (the reference's PaddleOCR en models; "
                    f"compute nodes never download): `{DOWNLOAD_HINT.format(dir=ckpt_dir)}` on the login node")
            _extract(tar_path, name, folder)
        out[arg] = str(folder)
    return out
