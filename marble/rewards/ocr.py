"""OCR reward: 1 - Levenshtein(recognized, target) / len(target).

Backends: PaddleOCR 2.x (the paper's 2.9.1, PP-OCRv4; English, no angle classifier, CPU),
`rapidocr_onnxruntime` 1.x (PP-OCRv4 det/rec ONNX models inside the wheel: offline, CPU, the
paper's recogniser family) and `rapidocr` 3.x (PP-OCRv6 small models in the wheel).
`backend="auto"` takes the first importable of paddle, rapidocr_onnxruntime, rapidocr.
Images go to every engine as RGB arrays, as the reference passes them (np.array of a PIL
image, although the engines expect OpenCV's BGR): the recogniser sees what the paper's saw.

Two target rules: `reference_rules: true` (the paper presets) is the reference's: the text
after the first double quote up to the next one (`prompt.split('"')[1]`), and an engine
error scores 0 (its "maximum penalty"). `reference_rules: false` (default, tiny preset):
the first non-empty "..." span, and an engine error is NaN (masked, counted).
"""

from __future__ import annotations

import importlib.util
import logging

import numpy as np
import torch

from marble.rewards.base import Reward, quoted_target, reference_quoted_target, to_uint8_hwc
from marble.rewards.base import ckpt_dir as resolve_ckpt_dir
from marble.rewards.paddle_models import model_dirs
from marble.runtime import install

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


# What each engine is (recorded in run_info.json and the report): only paddle is the paper's.
ENGINE_LABELS = {
    "paddle": "PaddleOCR 2.x lang=en (en PP-OCRv3 det + en PP-OCRv4 rec): the reference's engine",
    "rapidocr_onnxruntime": "ONNX: rapidocr-onnxruntime 1.x bundled zh PP-OCRv4 det/rec, not the paper's engine",
    "rapidocr": "ONNX: rapidocr 3.x bundled PP-OCRv5/v6 models, not the paper's engine",
}


def resolve_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"ocr: backend must be one of {BACKENDS}, got {backend!r}")
    if backend != "auto":
        return backend
    # The paper's recogniser family (PP-OCRv4) first: paddle 2.x, then rapidocr-onnxruntime 1.x.
    preference = (("paddle", "paddleocr"), ("rapidocr_onnxruntime", "rapidocr_onnxruntime"), ("rapidocr", "rapidocr"))
    for name, module in preference:
        if importlib.util.find_spec(module):
            # Never silently: which engine `auto` picked is logged here and recorded (engine_label).
            log.warning("ocr: backend 'auto' chose %r (%s); name `backend: paddle` for the paper's engine",
                        name, ENGINE_LABELS[name])
            return name
    raise ImportError(
        f"ocr backend 'auto' found none of paddleocr, rapidocr_onnxruntime, rapidocr: "
        f"`{install.extra('ocr')}` (in the repository)"
    )


class _Rapid:
    """rapidocr 3.x with its bundled PP-OCRv6 models (sha256-checked, never downloaded when present)."""

    def __init__(self):
        try:
            from rapidocr import RapidOCR
        except ImportError as err:
            raise ImportError(f"ocr backend 'rapidocr' needs `{install.extra('ocr')}` (rapidocr>=3)") from err
        # No angle classifier, as the reference; "error" log level: empty images would warn per call.
        params = {"Global.use_cls": False, "Global.text_score": DROP_SCORE, "Global.log_level": "error"}
        self.engine = RapidOCR(params=params)

    def read(self, image: np.ndarray) -> str:
        return "".join(self.engine(image).txts or ())


class _RapidOnnxruntime:
    """rapidocr_onnxruntime 1.x with its bundled PP-OCRv4 models."""

    def __init__(self):
        try:
            from rapidocr_onnxruntime import RapidOCR
        except ImportError as err:
            raise ImportError(f"ocr backend 'rapidocr_onnxruntime' needs `{install.extra('ocr')}`") from err
        self.engine = RapidOCR(text_score=DROP_SCORE, use_cls=False)

    def read(self, image: np.ndarray) -> str:
        result, _ = self.engine(image)
        return "".join(line[1] for line in result or [])


def require_paddleocr_2(version: str) -> None:
    """The 2.x API is what the reference calls; 3.x rejects `use_gpu`/`show_log`/`drop_score`."""
    if int(version.split(".")[0]) != 2:
        raise ImportError(
            f"ocr backend 'paddle' uses the PaddleOCR 2.x API of the reference (2.9.1); found paddleocr "
            f"{version}: `{install.extra('paddle')}` (paddleocr>=2.9.1,<3, CPU paddle; on a GPU "
            f"`{install.paddle_gpu()}`; docs/rewards.md)"
        )


class _Paddle:
    def __init__(self, use_gpu: bool, ckpt_dir: str | None = None):
        try:
            import paddleocr
            from paddleocr import PaddleOCR
        except ImportError as err:
            raise ImportError(f"ocr backend 'paddle' needs `{install.extra('paddle')}` (CPU paddle; on a GPU "
                              f"`{install.paddle_gpu()}`; see docs/rewards.md)") from err
        require_paddleocr_2(getattr(paddleocr, "__version__", "0"))

        # The reference's settings: English, no angle classifier, CPU; its default en models,
        # read from the reward-checkpoint folder (fetched on the login node).
        self.engine = PaddleOCR(use_angle_cls=False, lang="en", use_gpu=use_gpu, show_log=False,
                                drop_score=DROP_SCORE, **model_dirs(resolve_ckpt_dir(ckpt_dir)))

    def read(self, image: np.ndarray) -> str:
        result = self.engine.ocr(image, cls=False)
        lines = result[0] if result and result[0] else []
        return "".join(text for _, (text, conf) in lines if conf > 0)


class OCRReward(Reward):
    """Applies to prompts with a target (see the module docstring for the two rules)."""

    name = "ocr"
    MASK_OPTIONS = ("reference_rules",)
    reference_rules = False  # class default, so weight-free `applicability` objects have it

    def __init__(self, backend: str = "auto", use_gpu: bool = False, reference_rules: bool = False,
                 ckpt_dir: str | None = None, **kw):
        super().__init__(**kw)
        self.reference_rules = bool(reference_rules)
        self.backend = resolve_backend(backend)
        engines = {"paddle": lambda: _Paddle(use_gpu, ckpt_dir), "rapidocr": _Rapid,
                   "rapidocr_onnxruntime": _RapidOnnxruntime}
        self.engine = engines[self.backend]()
        self.errors = 0  # OCR engine exceptions (NaN samples, or 0 under reference_rules)

    @property
    def engine_label(self) -> str:
        return f"{self.backend}: {ENGINE_LABELS[self.backend]}"

    def target(self, prompt: str) -> str | None:
        return reference_quoted_target(prompt) if self.reference_rules else quoted_target(prompt)

    def applies_by_content(self, prompt, metadata):
        return self.target(prompt) is not None

    def read(self, image_rgb_uint8: np.ndarray) -> str:
        """Recognized text of one HWC RGB uint8 image, passed as RGB like the reference."""
        return self.engine.read(np.ascontiguousarray(image_rgb_uint8))

    def score(self, images, prompts, metadata):
        out = torch.full((len(prompts),), float("nan"))
        on_error = 0.0 if self.reference_rules else float("nan")
        for i, (img, prompt) in enumerate(zip(to_uint8_hwc(images), prompts)):
            try:
                out[i] = ocr_similarity(self.read(img), self.target(prompt))
            except Exception as err:  # noqa: BLE001 - one bad image must not kill the batch
                self.errors += 1
                out[i] = on_error
                log.warning("ocr: sample %d failed (%s: %s); scored %s", i, type(err).__name__, err, on_error)
        return out

    def counters(self):
        return {**super().counters(), "errors": self.errors}
