"""OCR reward: 1 - Levenshtein(recognized, target) / len(target), target = first quoted span.

Backends: PaddleOCR (the paper's; English, no angle classifier), `rapidocr` 3.x (PP-OCRv6 small
det/rec ONNX models inside the wheel: offline, CPU) and the older `rapidocr_onnxruntime` 1.x
(PP-OCRv4 in the wheel). `backend="auto"` takes the first importable of paddle, rapidocr,
rapidocr_onnxruntime. PP-OCRv4 misreads a firework spark in ../shared/images/hello_world.jpg as
an apostrophe ("Hello'"); PP-OCRv6 reads "Hello" "World!", hence v3 before 1.x.
"""

from __future__ import annotations

import importlib.util
import logging

import numpy as np
import torch

from marble.rewards.base import Reward, quoted_target, to_uint8_hwc

log = logging.getLogger(__name__)
BACKENDS = ("auto", "paddle", "rapidocr", "rapidocr_onnxruntime")
# Boxes whose recognition confidence is below this are dropped: PaddleOCR's drop_score default,
# which the reference inherits; both rapidocr packages use the same default (text_score).
DROP_SCORE = 0.5


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
    if backend != "auto":
        return backend
    preference = (("paddle", "paddleocr"), ("rapidocr", "rapidocr"), ("rapidocr_onnxruntime", "rapidocr_onnxruntime"))
    for name, module in preference:
        if importlib.util.find_spec(module):
            return name
    raise ImportError(
        "ocr backend 'auto' found none of paddleocr, rapidocr, rapidocr_onnxruntime: `pip install marble[ocr]`"
    )


class _Rapid:
    """rapidocr 3.x with its bundled PP-OCRv6 models (sha256-checked, never downloaded when present)."""

    def __init__(self):
        try:
            from rapidocr import RapidOCR
        except ImportError as err:
            raise ImportError("ocr backend 'rapidocr' needs `pip install marble[ocr]` (rapidocr>=3)") from err
        # No angle classifier, as the reference; "error" log level: empty images would warn per call.
        params = {"Global.use_cls": False, "Global.text_score": DROP_SCORE, "Global.log_level": "error"}
        self.engine = RapidOCR(params=params)

    def read(self, bgr: np.ndarray) -> str:
        return "".join(self.engine(bgr).txts or ())


class _RapidOnnxruntime:
    """rapidocr_onnxruntime 1.x with its bundled PP-OCRv4 models."""

    def __init__(self):
        try:
            from rapidocr_onnxruntime import RapidOCR
        except ImportError as err:
            raise ImportError("ocr backend 'rapidocr_onnxruntime' needs `pip install rapidocr-onnxruntime`") from err
        self.engine = RapidOCR(text_score=DROP_SCORE, use_cls=False)

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
        self.engine = PaddleOCR(use_angle_cls=False, lang="en", use_gpu=use_gpu, show_log=False, drop_score=DROP_SCORE)

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
        engines = {"paddle": lambda: _Paddle(use_gpu), "rapidocr": _Rapid, "rapidocr_onnxruntime": _RapidOnnxruntime}
        self.engine = engines[self.backend]()
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
