"""GenEval's 80 class names and the map from the detector's COCO names to them.

The metadata names classes as GenEval's `object_names.txt` does ("computer mouse",
"tv remote", "computer keyboard"); mmdet's COCO detector calls the same classes "mouse",
"remote", "keyboard". The reference reads object_names.txt and names detector class k by
its k-th line, so the detector's labels must be renamed, or 132 of the 2,212 test prompts
could never be satisfied. Pure data; no heavy imports.
"""

from __future__ import annotations

from typing import Sequence

# object_names.txt of GenEval (djghosh13/geneval), in the COCO label order of the detector.
GENEVAL_CLASSES: tuple[str, ...] = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat",
    "traffic light", "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog",
    "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella",
    "handbag", "tie", "suitcase", "frisbee", "skis", "snowboard", "sports ball", "kite",
    "baseball bat", "baseball glove", "skateboard", "surfboard", "tennis racket", "bottle",
    "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple", "sandwich", "orange",
    "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch", "potted plant",
    "bed", "dining table", "toilet", "tv", "laptop", "computer mouse", "tv remote",
    "computer keyboard", "cell phone", "microwave", "oven", "toaster", "sink", "refrigerator",
    "book", "clock", "vase", "scissors", "teddy bear", "hair drier", "toothbrush",
)
# The only names mmdet's COCO classes spell differently.
COCO_TO_GENEVAL = {"mouse": "computer mouse", "remote": "tv remote", "keyboard": "computer keyboard"}


def detector_class_names(detector_classes: Sequence[str]) -> list[str]:
    """GenEval's name for each detector label, by index as the reference does; checked, so a
    detector with another class list or order is an error instead of silent misnaming."""
    detector_classes = list(detector_classes)
    if len(detector_classes) != len(GENEVAL_CLASSES):
        raise ValueError(f"geneval: the detector has {len(detector_classes)} classes, GenEval names "
                         f"{len(GENEVAL_CLASSES)} (COCO); use a COCO detector")
    for k, (det, ours) in enumerate(zip(detector_classes, GENEVAL_CLASSES)):
        if COCO_TO_GENEVAL.get(det, det) != ours:
            raise ValueError(f"geneval: detector class {k} is {det!r}, GenEval's object_names.txt says {ours!r}")
    return list(GENEVAL_CLASSES)
