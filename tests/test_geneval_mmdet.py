"""GenEval end to end on the real mmdet 2.x Mask2Former path (tiny random weights in the reference's
config and checkpoint formats). Needs mmdet 2.x + mmcv-full: `make test-geneval-mmdet` builds that
environment; everywhere else (the normal venv, CI) this module skips.

A random detector detects random things, so the tests assert formats, structure and that each
stage (load, inference, parsing to GenEval names, rules, colour CLIP, evaluate) is reached."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("mmdet")
pytest.importorskip("mmcv.ops")  # mmcv-full with its compiled ops, not mmcv-lite

from conftest import SHARED  # noqa: E402
from test_evaluate import raw_dir, rows  # noqa: E402,F401  (raw_dir is a fixture)

from marble.rewards.geneval_names import GENEVAL_CLASSES  # noqa: E402

SIZE = 128


@pytest.fixture(scope="module")
def tiny_detector(tmp_path_factory) -> tuple[Path, Path]:
    from beds.mmdet_replica import build

    return build(tmp_path_factory.mktemp("mask2former"), seed=0)


@pytest.fixture(scope="module")
def color_clip(tmp_path_factory) -> Path:
    from beds.replicas import clip_repo

    out = tmp_path_factory.mktemp("clip") / "clip-vit-large-patch14"
    clip_repo(out, seed=3)
    return out


@pytest.fixture(scope="module")
def detector(tiny_detector):
    from marble.rewards.geneval import MMDetDetector

    return MMDetDetector(str(tiny_detector[0]), str(tiny_detector[1]), "cpu")


def images(n: int = 4) -> torch.Tensor:
    """[n,3,SIZE,SIZE] in [0,1]: the real photos of ../shared/images when present, else noise."""
    from PIL import Image

    files = sorted((SHARED / "images").glob("*")) if (SHARED / "images").is_dir() else []
    rng = np.random.default_rng(0)
    arrays = [np.asarray(Image.open(f).convert("RGB").resize((SIZE, SIZE))) for f in files[:n]]
    arrays += [rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8) for _ in range(n - len(arrays))]
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).float() / 255


def test_config_inherits_the_reference_and_checkpoint_is_openmmlab(tiny_detector, tmp_path):
    from mmcv import Config

    from beds.mmdet_replica import write_checkpoint

    config, ckpt = tiny_detector
    cfg = Config.fromfile(str(config))
    assert "mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco.py" in config.read_text()
    # From the reference files, untouched: Swin with 7x7 windows, 80 COCO things, instances only.
    assert cfg.model.backbone.type == "SwinTransformer" and cfg.model.backbone.window_size == 7
    assert cfg.model.panoptic_head.num_things_classes == 80 and cfg.model.test_cfg.panoptic_on is False
    assert cfg.model.test_cfg.max_per_image == 100 and cfg.data.test.pipeline[1].img_scale == (1333, 800)
    assert cfg.model.backbone.depths == [2, 2, 2, 2] and cfg.model.panoptic_head.feat_channels == 32
    saved = torch.load(ckpt, map_location="cpu", weights_only=True)  # the safe loader reads it
    assert set(saved) == {"meta", "state_dict"}
    assert len(saved["meta"]["CLASSES"]) == 80 and "mouse" in saved["meta"]["CLASSES"]  # mmdet's names
    # Same seed, same bytes (torch.save names its archive after the file: same name, other folder).
    assert write_checkpoint(config, tmp_path / "again" / ckpt.name, seed=0).read_bytes() == ckpt.read_bytes()
    other = torch.load(write_checkpoint(config, tmp_path / "other.pth", seed=1), weights_only=True)
    key = "panoptic_head.query_feat.weight"
    assert not torch.equal(saved["state_dict"][key], other["state_dict"][key])


def test_detector_loads_every_weight_and_names_classes_as_geneval(tiny_detector, detector):
    state = torch.load(tiny_detector[1], map_location="cpu", weights_only=True)["state_dict"]
    model_state = detector.model.state_dict()
    assert set(model_state) == set(state)  # no missing or unexpected key
    assert all(torch.equal(model_state[k], v) for k, v in state.items())
    assert list(detector.classes) == list(GENEVAL_CLASSES)  # "computer mouse", not mmdet's "mouse"


def test_detections_are_parsed_into_geneval_structures(detector):
    arrays = [np.ascontiguousarray(a) for a in (images() * 255).round().byte().permute(0, 2, 3, 1).numpy()]
    raw = detector.detect(arrays)
    assert len(raw) == len(arrays)
    total = 0
    for per_class in raw:
        assert set(per_class) <= set(GENEVAL_CLASSES)
        for dets in per_class.values():
            n = len(dets.scores)
            total += n
            assert dets.boxes.shape == (n, 4) and np.isfinite(dets.boxes).all()
            assert ((dets.scores >= 0) & (dets.scores <= 1)).all()
            assert (dets.boxes[:, 2] >= dets.boxes[:, 0]).all() and (dets.boxes[:, 3] >= dets.boxes[:, 1]).all()
            assert dets.masks.shape == (n, SIZE, SIZE) and dets.masks.dtype == bool
        assert sum(len(d.scores) for d in per_class.values()) <= 100  # the config's max_per_image
    assert total > 0


class CountingColors:
    """Wraps the real CLIP colour classifier (same call signature), recording its answers."""

    def __init__(self, inner):
        self.inner, self.answers = inner, []

    def __call__(self, image_rgb, objects, classname):
        self.answers.append(self.inner(image_rgb, objects, classname))
        return self.answers[-1]


def _confident_class(detector, image: np.ndarray) -> tuple[str, int]:
    """A class the tiny detector finds in `image` above GenEval's threshold, and how many."""
    from marble.rewards.geneval_rules import select_objects

    objects = select_objects(detector.detect([image])[0], "colors")
    assert objects, "the tiny detector found nothing above the threshold"
    name = max(objects, key=lambda k: len(objects[k]))
    return name, len(objects[name])


def test_geneval_reward_end_to_end_with_real_mmdet(tiny_detector, color_clip, detector):
    from marble.rewards.geneval import ClipColorClassifier, GenEvalReward

    batch = images()
    first = (batch[0] * 255).round().byte().permute(1, 2, 0).numpy()
    cls, n = _confident_class(detector, first)
    other = "dog" if cls != "dog" else "cat"
    metadata = [
        # The count found, so the rules go on to ask the colour classifier (they stop at a wrong count).
        {"tag": "colors", "include": [{"class": cls, "count": n, "color": "red"}]},
        {"tag": "counting", "include": [{"class": cls, "count": 2}], "exclude": [{"class": cls, "count": 3}]},
        {"tag": "position", "include": [{"class": other, "count": 1},
                                        {"class": cls, "count": 1, "position": ["left of", 0]}]},
        {"tag": "single_object", "include": [{"class": cls, "count": 1}]},
    ]
    reward = GenEvalReward(detector_config=str(tiny_detector[0]), detector_ckpt=str(tiny_detector[1]),
                           clip_model=str(color_clip), detector="mmdet", batch_size=3)
    reward._load()
    assert isinstance(reward.color_classifier, ClipColorClassifier)
    reward.color_classifier = spy = CountingColors(reward.color_classifier)
    details = reward.evaluate_detail(batch, metadata)
    assert [d["tag"] for d in details] == [m["tag"] for m in metadata]
    for d in details:
        # Partial credit may go below 0 (a count far off), never above 1; strict/accuracy are 0/1.
        assert math.isfinite(d["score"]) and d["score"] <= 1.0
        assert d["strict_accuracy"] in (0.0, 1.0) and d["accuracy"] in (0.0, 1.0)
        assert d["score"] == 1.0 or not d["strict_accuracy"]
        assert isinstance(d["reasons"], list)
    # Image 0 holds n `cls`: their colours went through the CLIP classifier, and the score is the
    # reference's mean of the count credit (1) and the colour credit 1 - |n - n_red| / n.
    assert len(spy.answers) == 1 and len(spy.answers[0]) == n
    n_red = spy.answers[0].count("red")
    assert details[0]["score"] == pytest.approx((1 + 1 - abs(n - n_red) / n) / 2)
    assert not any(r.startswith(f"expected {cls}==") for r in details[0]["reasons"])  # count matched
    scores = reward.score(batch, [""] * len(metadata), metadata)
    assert scores.shape == (len(metadata),) and torch.isfinite(scores).all()
    assert scores.tolist() == pytest.approx([d["score"] for d in details])


def test_evaluate_geneval_with_the_real_detector(tiny_model_dir, raw_dir, tiny_detector, color_clip, tmp_path):
    from marble import evaluate

    # Inline JSON, as the workflow passes eval.reward_options.
    options = json.dumps({"geneval": {"detector": "mmdet", "detector_config": str(tiny_detector[0]),
                                      "detector_ckpt": str(tiny_detector[1]), "clip_model": str(color_clip)}})
    out = tmp_path / "geneval"
    argv = ["--model_path", str(tiny_model_dir), "--dataset", "geneval", "--data_dir", str(raw_dir),
            "--output_dir", str(out), "--resolution", "64", "--num_inference_steps", "2", "--batch_size", "3",
            "--reward_options", options]
    assert evaluate.main(argv) == 0
    got = rows(out)
    assert len(got) == len((raw_dir / "geneval" / "test_metadata.jsonl").read_text().splitlines())
    for row in got:
        assert math.isfinite(row["scores"]["geneval"]) and row["scores"]["geneval"] <= 1.0
        assert row["scores"]["accuracy"] in (0.0, 1.0)
    avg = json.loads((out / "average_scores.json").read_text())
    assert math.isfinite(avg["geneval_overall"]) and avg["geneval_tags_present"] == len(got)
