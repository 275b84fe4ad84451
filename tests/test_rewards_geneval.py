"""GenEval rule engine on synthetic detections; expected values computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from marble.rewards import geneval_rules as R


def obj(x1, y1, x2, y2, score=0.95):
    return R.DetectedObject(np.array([x1, y1, x2, y2], dtype=float), score)


def colors_by_score(table):
    """A fake colour classifier: the colour is looked up by the object's detection score."""
    calls = []

    def colors_of(objs, name):
        calls.append(len(objs))
        return [table[o.score] for o in objs]

    colors_of.calls = calls
    return colors_of


NO_COLOR = colors_by_score({})


def detail(objects, meta, colors_of=NO_COLOR):
    return R.evaluate_detail(objects, meta, colors_of)


def test_select_objects_thresholds_order_and_cap():
    raw = {"dog": R.ClassDetections(np.zeros((3, 4)), np.array([0.5, 0.95, 0.2])),
           "cat": R.ClassDetections(np.zeros((20, 4)), np.full(20, 0.99))}
    counting = R.select_objects(raw, "counting")
    assert [o.score for o in counting["dog"]] == [0.95]  # 0.9 threshold for counting prompts
    other = R.select_objects(raw, "two_object")
    assert [o.score for o in other["dog"]] == [0.95, 0.5]  # best first, 0.3 threshold
    assert len(other["cat"]) == 16
    none = R.select_objects({"dog": R.ClassDetections(np.zeros((1, 4)), np.array([0.1]))}, "colors")
    assert "dog" not in none


def test_relative_position_by_hand():
    # centres 5 and 55: offset -50, margin 0.1*(10+10)=2 -> revised -48, dx=-0.96
    assert R.relative_position([0, 0, 10, 10], [50, 0, 60, 10]) == {"left of"}
    assert R.relative_position([50, 0, 60, 10], [0, 0, 10, 10]) == {"right of"}
    assert R.relative_position([0, 0, 10, 10], [0, 50, 10, 60]) == {"above"}
    # offset 1 < margin 2: no relation
    assert R.relative_position([0, 0, 10, 10], [1, 0, 11, 10]) == set()
    # diagonal: dx=dy=-(50-2)/sqrt(2*50^2)=-0.679 -> both
    assert R.relative_position([0, 0, 10, 10], [50, 50, 60, 60]) == {"left of", "above"}


def test_relative_position_uses_box_centres_not_corners():
    """Boxes of different sizes, where the top-left corners and the centres disagree.

    A = [0, 0, 100, 10] (centre 50), B = [20, 0, 24, 10] (centre 22): centres offset +28,
    margin 0.1 * (100 + 4) = 10.4 -> revised 17.6, dx = 17.6 / 28 = 0.63 > 0.5: A is right
    of B. By corners (0 vs 20) A would be left of B or nothing. The same along y."""
    assert R.relative_position([0, 0, 100, 10], [20, 0, 24, 10]) == {"right of"}
    assert R.relative_position([20, 0, 24, 10], [0, 0, 100, 10]) == {"left of"}
    assert R.relative_position([0, 0, 10, 100], [0, 20, 10, 24]) == {"below"}
    # A small box inside a large one, at the large one's centre: no relation (offset 0),
    # although its corner is 48 px right of and below the large box's corner.
    assert R.relative_position([48, 48, 52, 52], [0, 0, 100, 100]) == set()


def test_single_object_and_negative_count_credit():
    meta = {"tag": "single_object", "include": [{"class": "dog", "count": 1}]}
    one = detail({"dog": [obj(0, 0, 5, 5)]}, meta)
    assert (one["score"], one["strict_accuracy"], one["accuracy"]) == (1.0, 1.0, 1.0)
    two = detail({"dog": [obj(0, 0, 5, 5), obj(5, 5, 9, 9, 0.9)]}, meta)
    assert (two["score"], two["strict_accuracy"], two["accuracy"]) == (0.0, 0.0, 1.0)  # >= in standard
    three = detail({"dog": [obj(0, 0, 1, 1)] * 3}, meta)
    assert three["score"] == -1.0  # 1 - |1-3|/1
    none = detail({}, meta)
    assert (none["score"], none["accuracy"]) == (0.0, 0.0)


def test_counting_with_exclude():
    meta = {"tag": "counting", "include": [{"class": "wine glass", "count": 2}],
            "exclude": [{"class": "wine glass", "count": 3}]}
    three = detail({"wine glass": [obj(0, 0, 1, 1)] * 3}, meta)
    assert (three["score"], three["strict_accuracy"], three["accuracy"]) == (0.5, 0.0, 0.0)
    two = detail({"wine glass": [obj(0, 0, 1, 1)] * 2}, meta)
    assert (two["score"], two["strict_accuracy"], two["accuracy"]) == (1.0, 1.0, 1.0)
    one = detail({"wine glass": [obj(0, 0, 1, 1)]}, meta)
    assert (one["score"], one["accuracy"]) == (0.5, 0.0)


def test_colors_and_color_attr():
    colors_of = colors_by_score({0.95: "red", 0.8: "blue", 0.7: "pink", 0.6: "black"})
    meta = {"tag": "colors", "include": [{"class": "dog", "count": 1, "color": "red"}]}
    assert detail({"dog": [obj(0, 0, 5, 5)]}, meta, colors_of)["score"] == 1.0
    blue = detail({"dog": [obj(0, 0, 5, 5, 0.8)]}, meta, colors_of)
    assert (blue["score"], blue["strict_accuracy"], blue["accuracy"]) == (0.5, 0.0, 0.0)  # [1, 0]
    assert detail({}, meta, colors_of)["score"] == 0.0  # [0 count, 0 colour placeholder]
    # Two dogs, the best one red: strict fails on the count ([0, 0]); standard checks the first one only.
    two = detail({"dog": [obj(0, 0, 5, 5), obj(0, 0, 5, 5, 0.8)]}, meta, colors_of)
    assert (two["score"], two["strict_accuracy"], two["accuracy"]) == (0.0, 0.0, 1.0)
    attr = {"tag": "color_attr", "include": [{"class": "handbag", "count": 1, "color": "pink"},
                                             {"class": "scissors", "count": 1, "color": "black"}]}
    wrong = detail({"handbag": [obj(0, 0, 5, 5, 0.7)], "scissors": [obj(0, 0, 5, 5, 0.8)]}, attr, colors_of)
    assert wrong["score"] == 0.75 and wrong["accuracy"] == 0.0  # [1, 1, 1, 0]
    right = detail({"handbag": [obj(0, 0, 5, 5, 0.7)], "scissors": [obj(0, 0, 5, 5, 0.6)]}, attr, colors_of)
    assert (right["score"], right["strict_accuracy"], right["accuracy"]) == (1.0, 1.0, 1.0)


def test_position_and_the_half_credit_quirk():
    meta = {"tag": "position", "include": [{"class": "dog", "count": 1},
                                           {"class": "cat", "count": 1, "position": ["left of", 0]}]}
    dog = obj(50, 0, 60, 10)
    ok = detail({"dog": [dog], "cat": [obj(0, 0, 10, 10)]}, meta)
    assert (ok["score"], ok["strict_accuracy"], ok["accuracy"]) == (1.0, 1.0, 1.0)  # [1, 1, 1]
    # Failed position appends 0.0 and 1.0: [1, 1, 0, 1] -> 3/4 (spec A.13 (ii))
    bad = detail({"dog": [dog], "cat": [obj(100, 0, 110, 10)]}, meta)
    assert (bad["score"], bad["strict_accuracy"], bad["accuracy"]) == (0.75, 0.0, 0.0)
    # No target: dog count credit 0, cat count 1, position 0 -> 1/3
    lonely = detail({"cat": [obj(0, 0, 10, 10)]}, meta)
    assert lonely["score"] == pytest.approx(1 / 3) and lonely["accuracy"] == 0.0


def test_two_object_partial():
    meta = {"tag": "two_object", "include": [{"class": "dog", "count": 1}, {"class": "bus", "count": 1}]}
    half = detail({"dog": [obj(0, 0, 5, 5)]}, meta)
    assert (half["score"], half["strict_accuracy"], half["accuracy"]) == (0.5, 0.0, 0.0)


def test_colours_classified_once_and_strict_only():
    colors_of = colors_by_score({0.95: "red"})
    meta = {"tag": "colors", "include": [{"class": "dog", "count": 1, "color": "red"}]}
    d = R.evaluate_detail({"dog": [obj(0, 0, 5, 5)]}, meta, colors_of)
    assert colors_of.calls == [1]  # strict and standard share the crop's colour
    s = R.evaluate_detail({"dog": [obj(0, 0, 5, 5)]}, meta, colors_of, strict_only=True)
    assert math.isnan(s["accuracy"]) and s["score"] == d["score"] == 1.0


def test_per_tag_means_skip_unscorable_and_absent_values():
    details = [{"tag": "counting", "accuracy": 1.0}, {"tag": "counting", "accuracy": 0.0},
               {"tag": "colors", "accuracy": 1.0}, {"tag": "colors", "accuracy": float("nan")},
               {"tag": "position", "accuracy": None}, {"tag": "position"}]
    assert R.per_tag_means(details) == {"counting": 0.5, "colors": 1.0}


# mmdet 2.x CocoDataset.CLASSES, the detector's own label names.
MMDET_COCO = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat", "traffic light",
    "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog", "horse", "sheep", "cow",
    "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella", "handbag", "tie", "suitcase", "frisbee",
    "skis", "snowboard", "sports ball", "kite", "baseball bat", "baseball glove", "skateboard", "surfboard",
    "tennis racket", "bottle", "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple",
    "sandwich", "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch",
    "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "mouse", "remote", "keyboard",
    "cell phone", "microwave", "oven", "toaster", "sink", "refrigerator", "book", "clock", "vase", "scissors",
    "teddy bear", "hair drier", "toothbrush",
)


def test_detector_labels_get_genevals_names():
    from marble.rewards.geneval_names import detector_class_names

    names = detector_class_names(MMDET_COCO)
    assert len(names) == 80 and names[64:67] == ["computer mouse", "tv remote", "computer keyboard"]
    assert names[:3] == ["person", "bicycle", "car"]
    with pytest.raises(ValueError, match="detector class 1 is 'car'"):
        detector_class_names(("person", "car", "bicycle") + MMDET_COCO[3:])
    with pytest.raises(ValueError, match="has 3 classes"):
        detector_class_names(MMDET_COCO[:3])


def test_mmdet_results_are_named_as_geneval():
    from marble.rewards.geneval import MMDetDetector
    from marble.rewards.geneval_names import detector_class_names

    detector = MMDetDetector.__new__(MMDetDetector)  # no model: only the result parsing
    detector.classes = detector_class_names(MMDET_COCO)
    bbox = [np.zeros((0, 5), dtype=np.float32) for _ in MMDET_COCO]
    bbox[64] = np.array([[1, 2, 3, 4, 0.9]], dtype=np.float32)  # mmdet's "mouse"
    out = detector._per_class((bbox, None))
    assert list(out) == ["computer mouse"] and out["computer mouse"].scores.tolist() == pytest.approx([0.9])


def test_object_names_match_genevals_file(shared_dir):
    from marble.rewards.geneval_names import GENEVAL_CLASSES

    path = shared_dir / "datasets" / "geneval" / "object_names.txt"
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    assert tuple(path.read_text().splitlines()) == GENEVAL_CLASSES


def test_every_metadata_class_is_a_name_the_scorer_outputs(shared_dir):
    import json

    from marble.rewards.geneval_names import detector_class_names

    path = shared_dir / "datasets" / "geneval" / "test_metadata.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    outputs = set(detector_class_names(MMDET_COCO))
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    named = {c["class"] for r in records for c in r["include"] + r.get("exclude", [])}
    assert named <= outputs, sorted(named - outputs)
    renamed = {"computer mouse", "tv remote", "computer keyboard"}
    assert sum(bool(renamed & {c["class"] for c in r["include"] + r.get("exclude", [])}) for r in records) == 132
    assert {r["tag"] for r in records} == set(R.TAGS)


def test_ties_keep_the_reference_order_and_float32_threshold():
    boxes = np.array([[0, 0, 1, 1], [10, 0, 11, 1], [20, 0, 21, 1]], dtype=np.float32)
    raw = {"dog": R.ClassDetections(boxes, np.array([0.8, 0.8, 0.3], dtype=np.float32))}
    kept = R.select_objects(raw, "position")["dog"]
    # argsort ascending then reversed: of two equal scores, the later index comes first;
    # float32 0.3 is not > 0.3 (the comparison stays in the detector's float32).
    assert [o.box[0] for o in kept] == [10.0, 0.0]


class StandInDetector:
    """Raw per-class detections by image index (the real detector's `detect` interface)."""

    def __init__(self, per_image):
        self.per_image, self.calls = per_image, 0

    def detect(self, images):
        out = [self.per_image[self.calls + i] for i in range(len(images))]
        self.calls += len(images)
        return out


def det(*rows):
    """ClassDetections from (x1, y1, x2, y2, score) rows, float32 as mmdet returns them."""
    arr = np.array(rows, dtype=np.float32)
    return R.ClassDetections(arr[:, :4], arr[:, 4])


def test_reference_numbers_on_a_fixed_set_through_the_scorer_class():
    """Partial credit (training `score`), strict and standard accuracy, per sample, by hand."""
    import torch

    from marble.rewards.geneval import GenEvalReward

    metadata = [
        {"tag": "single_object", "include": [{"class": "computer mouse", "count": 1}]},
        {"tag": "counting", "include": [{"class": "cup", "count": 3}], "exclude": [{"class": "cup", "count": 4}]},
        {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "red"}]},
        {"tag": "position", "include": [{"class": "tv remote", "count": 1},
                                        {"class": "cat", "count": 1, "position": ["below", 0]}]},
        {"tag": "two_object", "include": [{"class": "dog", "count": 1}, {"class": "computer keyboard", "count": 1}]},
        {"tag": "color_attr", "include": [{"class": "bus", "count": 1, "color": "yellow"},
                                          {"class": "tie", "count": 1, "color": "blue"}]},
    ]
    detections = [
        {"computer mouse": det((0, 0, 9, 9, 0.99))},
        # counting uses the 0.9 threshold: 0.95, 0.92 kept, 0.5 dropped -> 2 of 3
        {"cup": det((0, 0, 5, 5, 0.95), (10, 0, 15, 5, 0.92), (20, 0, 25, 5, 0.5))},
        # two cars: strict count fails ([0, 0]); standard colours only the first (red)
        {"car": det((0, 0, 5, 5, 0.9), (10, 0, 15, 5, 0.8))},
        # cat above the remote, expected below: [1, 1, 0, 1] (the half-credit quirk)
        {"tv remote": det((0, 50, 10, 60, 0.9)), "cat": det((0, 0, 10, 10, 0.9))},
        {"dog": det((0, 0, 5, 5, 0.9))},  # keyboard missing: [1, 0]
        # bus yellow, tie red: [1, 1, 1, 0]
        {"bus": det((0, 0, 5, 5, 0.9)), "tie": det((10, 10, 15, 15, 0.9))},
    ]
    colours = {(0.0, "car"): "red", (10.0, "car"): "blue", (0.0, "bus"): "yellow", (10.0, "tie"): "red"}

    def colour_classifier(image, objects, classname):
        return [colours[(float(o.box[0]), classname)] for o in objects]

    reward = GenEvalReward(detector=StandInDetector(detections), color_classifier=colour_classifier, batch_size=4)
    images = torch.zeros(6, 3, 8, 8)
    details = reward.evaluate_detail(images, metadata)
    assert [d["score"] for d in details] == pytest.approx([1.0, 2 / 3, 0.0, 0.75, 0.5, 0.75])
    assert [d["strict_accuracy"] for d in details] == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert [d["accuracy"] for d in details] == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    assert [d["tag"] for d in details] == [m["tag"] for m in metadata]
    # one sample per tag here: each tag's mean is that sample's value
    assert R.per_tag_means(details, "accuracy") == {
        "single_object": 1.0, "counting": 0.0, "colors": 1.0, "position": 0.0, "two_object": 0.0,
        "color_attr": 0.0}
    # The training path: strict only, the partial credit as the reward.
    reward.detector = StandInDetector(detections)
    prompts = [""] * 6
    assert reward(images, prompts, metadata).tolist() == pytest.approx([1.0, 2 / 3, 0.0, 0.75, 0.5, 0.75])


def test_geneval_extra_installs_with_pip_and_names_what_mmcv_imports():
    """`pip install marble[geneval]` must not pull mmcv-full (its source build fails under build
    isolation) and must bring what mmcv 1.x imports (torchvision, yapf before 0.40.2)."""
    from pathlib import Path

    import tomllib

    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    extra = pyproject["project"]["optional-dependencies"]["geneval"]
    names = {req.split("=")[0].split(">")[0].split("<")[0] for req in extra}
    assert not any(name.startswith("mmcv") for name in names), extra
    assert {"mmdet", "torchvision", "yapf"} <= names and "yapf==0.40.1" in extra
    assert "open-clip-torch" not in names  # the colour classifier is transformers' CLIP


class _NotATensor:
    """A pickled object a weights-only read must refuse."""


def test_detector_checkpoint_is_read_weights_only_before_mmdet_loads_it(tmp_path):
    """mmcv 1.x unpickles checkpoints fully on torch < 2.6: MMDetDetector reads the file with
    weights_only=True first and refuses one holding arbitrary objects, naming the file."""
    import torch

    from marble.rewards.geneval import MMDetDetector

    bad = tmp_path / "bad.pth"
    torch.save({"meta": {"CLASSES": ("person",), "env": _NotATensor()}, "state_dict": {}}, bad)
    with pytest.raises(ValueError, match=r"bad.pth holds objects beyond tensors"):
        MMDetDetector("mask2former.py", str(bad))
    good = tmp_path / "good.pth"
    torch.save({"meta": {"CLASSES": ("person",), "epoch": 50},
                "state_dict": {"w": torch.zeros(2)}}, good)
    try:  # a safe file gets past the check: then mmdet loads it, or is missing
        MMDetDetector("missing-config.py", str(good))
    except ImportError as exc:
        assert "mmcv-full" in str(exc)
    except OSError:
        pass  # mmdet installed: the made-up config path is not found
