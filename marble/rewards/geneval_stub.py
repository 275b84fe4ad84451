"""A stand-in for GenEval's Mask2Former, behind the same `Detector` interface.

For runs where mmdet is not installed (CPU CI, `make test-paper`): the real `GenEvalReward`
(rules, colour classifier, counts, positions) runs on detections this class makes up from
the pixels, deterministically. Selected only by the reward option `detector: stub`; the
scores it gives are not GenEval scores (a warning says so when it is built).

Behaviour (documented, so tests can predict it): each image is split into a left and a
right half; each half is one detection with box = that half, mask = that half, score 0.95
(above the counting threshold 0.9), of class `classes[sum of the half's uint8 bytes % len(classes)]`.
Two halves of the same class are two objects of that class.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import numpy as np

from marble.rewards import geneval_rules as rules

log = logging.getLogger(__name__)
OBJECT_NAMES = "geneval/object_names.txt"  # in the reward-checkpoint dir (`marble download rewards`)
STUB_SCORE = 0.95


def read_object_names(path: str | Path) -> list[str]:
    """GenEval's class list, one name a line; an empty file is an error naming it."""
    names = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not names:
        raise ValueError(f"geneval: {path} lists no class names")
    return names


def halves(width: int) -> list[tuple[int, int]]:
    """[x0, x1) column ranges of the left and right halves (the right one takes an odd column)."""
    mid = width // 2
    return [(0, mid), (mid, width)]


class StubDetector:
    """Deterministic made-up detections (see the module docstring); not a detector."""

    def __init__(self, classes: Sequence[str]):
        if not classes:
            raise ValueError("geneval stub detector: no class names")
        self.classes = list(classes)
        log.warning("geneval: detector 'stub' makes up detections from pixel sums; scores are not GenEval's")

    def _one(self, image: np.ndarray) -> dict[str, rules.ClassDetections]:
        height, width = image.shape[:2]
        found: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        for x0, x1 in halves(width):
            name = self.classes[int(image[:, x0:x1].astype(np.int64).sum()) % len(self.classes)]
            mask = np.zeros((height, width), dtype=bool)
            mask[:, x0:x1] = True
            found.setdefault(name, []).append((np.array([x0, 0, x1, height], dtype=np.float32), mask))
        return {
            name: rules.ClassDetections(np.stack([b for b, _ in dets]), np.full(len(dets), STUB_SCORE, np.float32),
                                        np.stack([m for _, m in dets]))
            for name, dets in found.items()
        }

    def detect(self, images: list[np.ndarray]) -> list[dict[str, rules.ClassDetections]]:
        return [self._one(np.asarray(image)) for image in images]
