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


def test_per_tag_lists_and_means():
    details = [{"tag": "counting", "accuracy": 1.0}, {"tag": "counting", "accuracy": 0.0},
               {"tag": "colors", "accuracy": 1.0}]
    lists = R.per_tag_lists(details)
    assert lists["counting"] == [1.0, 0.0, R.TAG_FILLER] and lists["colors"] == [R.TAG_FILLER] * 2 + [1.0]
    assert R.per_tag_means(details) == {"counting": 0.5, "colors": 1.0}
