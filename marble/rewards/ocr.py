"""OCR reward: 1 - Levenshtein(recognized, target) / len(target), target = first quoted span.

Two backends: PaddleOCR (the paper's; English, no angle classifier) and rapidocr-onnxruntime
(PP-OCR ONNX models inside the wheel: runs offline on CPU). `backend="auto"` takes Paddle
when importable, else rapidocr.
"""

from __future__ import annotations

import importlib.util
import logging

import numpy as np
import torch

from marble.rewards.base import Reward, quoted_target, to_uint8_hwc

log = logging.getLogger(__name__)
BACKENDS = ("auto", "rapidocr", "paddle")


def normalize_text(text: str) -> str:
    """Lower-cased, spaces removed: the reference compares texts this way."""
    return text.replace(" ", "").lower()


def ocr_similarity(recognized: str, target: str) -> float:
    """1 - dist/len(target) in [0,1]; dist 0 if target is a substring, else Levenshtein capped at len."""
    from Levenshtein import distance

    recognized, target = normalize_text(recognized), normalize_text(target)
    if not target:
        raise ValueError("OCR target is empty after removing spaces")
    dist = 0 if target in recognized else min(distance(recognized, target), len(target))
    return 1.0 - dist / len(target)


def resolve_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"ocr: backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "paddle" if importlib.util.find_spec("paddleocr") else "rapidocr"
    return backend


class _Rapid:
    def __init__(self):
        try:
            from rapidocr_onnxruntime import RapidOCR
        except ImportError as err:
            raise ImportError("ocr backend 'rapidocr' needs `pip install marble[ocr]`") from err
        self.engine = RapidOCR()

    def read(self, bgr: np.ndarray) -> str:
        result, _ = self.engine(bgr)
        return "".join(line[1] for line in result or [])


class _Paddle:
    def __init__(self, use_gpu: bool):
        try:
            from paddleocr import PaddleOCR
        except ImportError as err:
            raise ImportError("ocr backend 'paddle' needs `pip install marble[paddle]` (see docs/rewards.md)") from err
        # The reference's settings: English, no angle classifier, CPU.
        self.engine = PaddleOCR(use_angle_cls=False, lang="en", use_gpu=use_gpu, show_log=False)

    def read(self, bgr: np.ndarray) -> str:
        result = self.engine.ocr(bgr, cls=False)
        lines = result[0] if result and result[0] else []
        return "".join(text for _, (text, conf) in lines if conf > 0)


class OCRReward(Reward):
    """Applies to prompts with a non-empty double-quoted span; a crash on one image is NaN."""

    name = "ocr"

    def __init__(self, backend: str = "auto", use_gpu: bool = False, **kw):
        super().__init__(**kw)
        self.backend = resolve_backend(backend)
        self.engine = _Paddle(use_gpu) if self.backend == "paddle" else _Rapid()
        self.errors = 0  # OCR engine exceptions (each one is a NaN sample)

    def applies_by_content(self, prompt, metadata):
        return quoted_target(prompt) is not None

    def read(self, image_rgb_uint8: np.ndarray) -> str:
        """Recognized text of one HWC RGB uint8 image (both engines take BGR, cv2 style)."""
        return self.engine.read(np.ascontiguousarray(image_rgb_uint8[..., ::-1]))

    def score(self, images, prompts, metadata):
        out = torch.full((len(prompts),), float("nan"))
        for i, (img, prompt) in enumerate(zip(to_uint8_hwc(images), prompts)):
            try:
                out[i] = ocr_similarity(self.read(img), quoted_target(prompt))
            except Exception as err:  # noqa: BLE001 - one bad image must not kill the batch
                self.errors += 1
                log.warning("ocr: sample %d failed (%s: %s); scored NaN", i, type(err).__name__, err)
        return out

    def counters(self):
        return {**super().counters(), "errors": self.errors}
