"""GenEval reward: a detector (mmdet Mask2Former) + a CLIP colour classifier + the rule engine.

The detector and colour classifier sit behind small interfaces (`detect`, `__call__`), so
the rules (`geneval_rules`) are tested on synthetic detections without mmdet; models load
on the first scored batch, not at construction.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np
import torch

from marble.rewards import geneval_rules as rules
from marble.rewards.base import Reward, require_file, to_uint8_hwc
from marble.rewards.base import ckpt_dir as resolve_ckpt_dir
from marble.rewards.clip_family import load_clip, projected_features
from marble.rewards.geneval_names import detector_class_names
from marble.rewards.geneval_stub import OBJECT_NAMES, StubDetector, read_object_names
from marble.runtime import install

DETECTOR_CKPT = "mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco_20220504_001756-743b7d99.pth"
DETECTOR_CONFIG = "mask2former/mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco.py"  # in mmdet 2.x's configs
COLOR_TEMPLATES = ("a photo of a {c} {cls}", "a photo of a {c}-colored {cls}", "a photo of a {c} object")


class Detector(Protocol):
    def detect(self, images: list[np.ndarray]) -> list[dict[str, rules.ClassDetections]]:
        """HWC uint8 RGB images -> per image, raw detections per class name."""


def check_safe_checkpoint(path: str | Path) -> None:
    """Read the detector checkpoint once with `weights_only=True` before mmdet loads it.

    mmcv 1.x's load_checkpoint calls torch.load without weights_only, which on torch < 2.6
    unpickles anything; a file holding more than tensors and plain containers is refused here,
    naming it, so the later full unpickle can only rebuild what this safe read accepted."""
    import pickle

    try:
        torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise ValueError(f"geneval: detector checkpoint {path} holds objects beyond tensors and "
                         f"plain containers; refusing to unpickle it ({str(exc).splitlines()[0]})") from exc


class MMDetDetector:
    """mmdet Mask2Former (2.x tuple results; 3.x DetDataSample also read)."""

    def __init__(self, config: str, ckpt: str, device: str = "cpu"):
        check_safe_checkpoint(ckpt)
        try:
            from mmdet.apis import inference_detector, init_detector
        except ImportError as err:
            raise ImportError("geneval needs mmcv-full 1.x, compiled first (docs/rewards.md; "
                              "`make test-geneval-mmdet` builds it on the CPU), then "
                              "workflow/envs/geneval.txt for mmdet 2.x") from err
        self._infer = inference_detector
        self.model = init_detector(config, ckpt, device=device)
        meta = getattr(self.model, "dataset_meta", None) or {}
        # GenEval's names ("computer mouse"), not mmdet's ("mouse"): the metadata uses them.
        self.classes = detector_class_names(getattr(self.model, "CLASSES", None) or meta.get("classes"))

    def _per_class(self, result) -> dict[str, rules.ClassDetections]:
        if hasattr(result, "pred_instances"):  # mmdet 3.x
            inst = result.pred_instances
            boxes, scores, labels = (inst.bboxes.cpu().numpy(), inst.scores.cpu().numpy(), inst.labels.cpu().numpy())
            masks = inst.masks.cpu().numpy() if "masks" in inst else None
            return {
                name: rules.ClassDetections(boxes[labels == k], scores[labels == k],
                                            None if masks is None else masks[labels == k])
                for k, name in enumerate(self.classes) if (labels == k).any()
            }
        bbox, segm = result if isinstance(result, tuple) else (result, None)
        out = {}
        for k, name in enumerate(self.classes):
            if len(bbox[k]):
                masks = None if segm is None else np.stack([np.asarray(m) for m in segm[k]])
                out[name] = rules.ClassDetections(bbox[k][:, :4], bbox[k][:, 4], masks)
        return out

    def detect(self, images):
        # RGB arrays as the reference passes them (np.array of a PIL image).
        return [self._per_class(r) for r in self._infer(self.model, list(images))]


class ClipColorClassifier:
    """Zero-shot colour of object crops (mask composited on grey #999, cropped to the box)
    with transformers' CLIP (openai ViT-L/14 is the model GenEval uses through open_clip)."""

    def __init__(self, model: str = "openai/clip-vit-large-patch14", device: str = "cpu", batch_size: int = 16,
                 ckpt_dir: str | None = None):
        # The hub id resolves to its downloaded folder under the reward-checkpoint dir.
        self.model, self.processor = load_clip(model, None, device, ckpt_dir)
        self.device, self.batch_size = device, batch_size
        self._classifiers: dict[str, torch.Tensor] = {}

    def _classifier(self, classname: str) -> torch.Tensor:
        if classname not in self._classifiers:
            weights = []
            for color in rules.COLORS:
                texts = [t.format(c=color, cls=classname) for t in COLOR_TEMPLATES]
                tok = self.processor(text=texts, padding=True, return_tensors="pt").to(self.device)
                features = projected_features(self.model.get_text_features(**tok))
                emb = torch.nn.functional.normalize(features.float(), dim=-1)
                weights.append(torch.nn.functional.normalize(emb.mean(0), dim=-1))
            self._classifiers[classname] = torch.stack(weights, dim=1)  # [D, 10]
        return self._classifiers[classname]

    @staticmethod
    def crops(image_rgb: np.ndarray, objects: Sequence[rules.DetectedObject]):
        from PIL import Image

        image = Image.fromarray(image_rgb)
        blank = Image.new("RGB", image.size, color="#999")
        out = []
        for obj in objects:
            shown = image if obj.mask is None else Image.composite(
                image, blank, Image.fromarray(np.asarray(obj.mask).astype(np.uint8) * 255))
            out.append(shown.crop(tuple(float(v) for v in obj.box[:4])))
        return out

    def __call__(self, image_rgb: np.ndarray, objects, classname: str) -> list[str]:
        crops, logits = self.crops(image_rgb, objects), []
        for i in range(0, len(crops), self.batch_size):
            pix = self.processor(images=crops[i : i + self.batch_size], return_tensors="pt").to(self.device)
            features = projected_features(self.model.get_image_features(**pix))
            emb = torch.nn.functional.normalize(features.float(), dim=-1)
            logits.append(emb @ self._classifier(classname))
        return [rules.COLORS[k] for k in torch.cat(logits).argmax(1).tolist()]


class GenEvalReward(Reward):
    """Applies to records with GenEval `include` clauses; returns the partial-credit score.

    `detector`: "mmdet" (default, the paper's Mask2Former), "stub" (marble.rewards.geneval_stub:
    deterministic made-up detections over GenEval's object_names.txt, for runs without mmdet;
    not GenEval scores), or a `Detector` object (tests)."""

    name = "geneval"

    def __init__(self, detector_config: str | None = None, detector_ckpt: str | None = None,
                 clip_model: str = "openai/clip-vit-large-patch14", ckpt_dir: str | None = None,
                 device: str = "cpu", batch_size: int = 64, detector: Detector | str = "mmdet",
                 color_classifier=None, **kw):
        super().__init__(**kw)
        self.device, self.batch_size, self.clip_model = device, int(batch_size), clip_model
        self.ckpt_dir = ckpt_dir
        folder = resolve_ckpt_dir(ckpt_dir)
        if detector == "stub":
            detector = StubDetector(read_object_names(require_file(self.name, OBJECT_NAMES, folder)))
        elif detector == "mmdet":
            detector = None
        elif isinstance(detector, str):
            raise ValueError(f"reward 'geneval': option detector={detector!r}; choose 'mmdet' or 'stub'")
        self.detector, self.color_classifier = detector, color_classifier
        if detector is None:  # fail at build time, not after the first rollout
            self.detector_ckpt = require_file(self.name, detector_ckpt or DETECTOR_CKPT, folder)
            self.detector_config = detector_config or mmdet_config_path(DETECTOR_CONFIG)

    def applies_by_content(self, prompt, metadata):
        return isinstance(metadata.get("include"), list) and bool(metadata["include"])

    def _load(self):
        if self.detector is None:
            self.detector = MMDetDetector(str(self.detector_config), str(self.detector_ckpt), self.device)
        if self.color_classifier is None:
            self.color_classifier = ClipColorClassifier(self.clip_model, self.device, ckpt_dir=self.ckpt_dir)

    def evaluate_detail(self, images: torch.Tensor, metadata: list[dict], strict_only: bool = False) -> list[dict]:
        """Per image: score, strict_accuracy, accuracy, tag, reasons (for evaluation)."""
        self._load()
        arrays, details = to_uint8_hwc(images), []
        for start in range(0, len(arrays), self.batch_size):
            chunk = arrays[start : start + self.batch_size]
            for array, raw, meta in zip(chunk, self.detector.detect(list(chunk)), metadata[start:]):
                objects = rules.select_objects(raw, meta.get("tag", ""))
                colors_of = functools.partial(self.color_classifier, array)
                details.append(rules.evaluate_detail(objects, meta, colors_of, strict_only))
        return details

    def score(self, images, prompts, metadata):
        details = self.evaluate_detail(images, metadata, strict_only=True)
        return torch.tensor([d["score"] for d in details], dtype=torch.float32)


def mmdet_config_path(relative: str) -> Path:
    """A config shipped inside the installed mmdet package (`.mim/configs`), else a clear error."""
    try:
        import mmdet
    except ImportError as err:
        raise ImportError(f"geneval needs mmdet 2.x: compile mmcv-full 1.x (workflow/envs/geneval.txt), then "
                          f"`{install.extra('geneval')}`, or pass detector_config=PATH") from err
    root = Path(mmdet.__file__).parent
    for candidate in (root / ".mim" / "configs" / relative, root.parent / "configs" / relative):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"geneval: mmdet config {relative} not found under {root}; pass detector_config=PATH")
