"""The GenEval rule engine as pure functions on detections (no detector, no CLIP here).

Three verdicts per image, as the reference computes them:
- `strict_evaluation` (training): exact counts on *all* kept detections; returns the
  partial-credit `score` = mean of a credit list (count credit 1 - |n_req - n|/n_req, which
  can be negative; colour credit alike; position entries) and strict correctness. Exclude
  clauses are not checked here (the reference does not). Quirk kept (docs/algorithm.md §3): a
  failed position check appends both 0.0 and 1.0 to the credit list.
- `standard_evaluation` (GenEval's accuracy): ">= count" on the first n detections,
  colour and position on those, and exclude clauses.
Colours come from a callable `colors_of(objects, classname) -> list[str]`, called only
when a clause needs it (it runs CLIP on crops).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import math

import numpy as np

THRESHOLD = 0.3
COUNTING_THRESHOLD = 0.9
MAX_OBJECTS = 16
POSITION_MARGIN = 0.1
# The one definition of GenEval's six tags (metadata `tag`), in the reference's order.
TAGS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")


@dataclass
class ClassDetections:
    """Raw detector output for one class: boxes [M,4] (x1,y1,x2,y2), scores [M], masks [M,H,W] or None."""

    boxes: np.ndarray
    scores: np.ndarray
    masks: np.ndarray | None = None


@dataclass
class DetectedObject:
    box: np.ndarray
    score: float
    mask: np.ndarray | None = field(default=None, repr=False)


Objects = dict[str, list[DetectedObject]]
ColorsOf = Callable[[Sequence[DetectedObject], str], list[str]]


def select_objects(raw: Mapping[str, ClassDetections], tag: str) -> Objects:
    """Keep detections above 0.3 (0.9 for counting prompts), best first, at most 16 per class; no NMS."""
    threshold = COUNTING_THRESHOLD if tag == "counting" else THRESHOLD
    objects: Objects = {}
    for name, det in raw.items():
        scores = np.asarray(det.scores)
        # The reference's order: ascending argsort reversed, so equal scores come out last index
        # first (it decides which objects the standard check's first n are).
        order = [i for i in np.argsort(scores)[::-1] if scores[i] > threshold][:MAX_OBJECTS]
        if order:
            masks = det.masks
            objects[name] = [
                DetectedObject(np.asarray(det.boxes[i][:4], dtype=np.float64), float(scores[i]),
                               None if masks is None else masks[i])
                for i in order
            ]
    return objects


def relative_position(box_a, box_b, margin: float = POSITION_MARGIN) -> set[str]:
    """Where A lies relative to B ('left of', 'right of', 'above', 'below'), margins discounted."""
    a, b = np.asarray(box_a[:4], dtype=np.float64), np.asarray(box_b[:4], dtype=np.float64)
    center_a, center_b = (a[:2] + a[2:]) / 2, (b[:2] + b[2:]) / 2
    dim_a, dim_b = np.abs(a[2:] - a[:2]), np.abs(b[2:] - b[:2])
    offset = center_a - center_b
    # Overlap within 10% of the summed sizes does not count as a relation.
    revised = np.maximum(np.abs(offset) - margin * (dim_a + dim_b), 0) * np.sign(offset)
    if np.all(np.abs(revised) < 1e-3):
        return set()
    dx, dy = revised / np.linalg.norm(offset)
    rels = set()
    if dx < -0.5:
        rels.add("left of")
    if dx > 0.5:
        rels.add("right of")
    if dy < -0.5:
        rels.add("above")
    if dy > 0.5:
        rels.add("below")
    return rels


def _position_holds(found, targets, relation: str) -> bool:
    return all(relation in relative_position(o.box, t.box) for o in found for t in targets)


def strict_evaluation(objects: Objects, metadata: Mapping, colors_of: ColorsOf) -> tuple[bool, float, list[str]]:
    """(strict correct, partial-credit score, reasons): the reference's training reward."""
    correct, credits, reasons, groups = True, [], [], []
    for req in metadata.get("include", []):
        name, n_req = req["class"], int(req["count"])
        found = objects.get(name, [])
        matched = len(found) == n_req
        credits.append(1 - abs(n_req - len(found)) / n_req)
        if not matched:
            reasons.append(f"expected {name}=={n_req}, found {len(found)}")
            if "color" in req or "position" in req:
                credits.append(0.0)
        else:
            if "color" in req:
                n_color = colors_of(found, name).count(req["color"])
                credits.append(1 - abs(n_req - n_color) / n_req)
                if n_color != n_req:
                    matched = False
                    reasons.append(f"expected {req['color']} {name}=={n_req}, found {n_color}")
            if "position" in req and matched:
                relation, target = req["position"]
                if groups[target] is None:
                    matched = False
                    credits.append(0.0)
                    reasons.append(f"no target for {name} to be {relation}")
                else:
                    if not _position_holds(found, groups[target], relation):
                        matched = False
                        credits.append(0.0)
                        reasons.append(f"expected {name} {relation} target")
                    credits.append(1.0)  # the reference appends this even after a failure (quirk)
        correct &= matched
        groups.append(found if matched else None)
    score = sum(credits) / len(credits) if credits else 0.0
    return correct, score, reasons


def standard_evaluation(objects: Objects, metadata: Mapping, colors_of: ColorsOf) -> tuple[bool, list[str]]:
    """(correct, reasons): GenEval's accuracy (>= counts on the first n objects, then excludes)."""
    correct, reasons, groups = True, [], []
    for req in metadata.get("include", []):
        name, n_req = req["class"], int(req["count"])
        found = objects.get(name, [])[:n_req]
        matched = len(found) >= n_req
        if not matched:
            reasons.append(f"expected {name}>={n_req}, found {len(found)}")
        else:
            if "color" in req and colors_of(found, name).count(req["color"]) < n_req:
                matched = False
                reasons.append(f"expected {req['color']} {name}>={n_req}")
            if "position" in req and matched:
                relation, target = req["position"]
                if groups[target] is None or not _position_holds(found, groups[target], relation):
                    matched = False
                    reasons.append(f"expected {name} {relation} target")
        correct &= matched
        groups.append(found if matched else None)
    for req in metadata.get("exclude", []):
        n_found = len(objects.get(req["class"], []))
        if n_found >= int(req["count"]):
            correct = False
            reasons.append(f"expected {req['class']}<{req['count']}, found {n_found}")
    return correct, reasons


def memoized_colors(colors_of: ColorsOf) -> ColorsOf:
    """Colour each object once per image (strict and standard share the top detections)."""
    cache: dict[int, str] = {}

    def cached(objs, name):
        todo = [o for o in objs if id(o) not in cache]
        if todo:
            cache.update(zip(map(id, todo), colors_of(todo, name)))
        return [cache[id(o)] for o in objs]

    return cached


def evaluate_detail(objects: Objects, metadata: Mapping, colors_of: ColorsOf, strict_only: bool = False) -> dict:
    """score / strict_accuracy / accuracy (NaN when strict_only) / tag / reasons for one image."""
    colors_of = memoized_colors(colors_of)
    strict, score, reasons = strict_evaluation(objects, metadata, colors_of)
    accuracy = float("nan")
    if not strict_only:
        accuracy = float(standard_evaluation(objects, metadata, colors_of)[0])
    return {"score": float(score), "strict_accuracy": float(strict), "accuracy": accuracy,
            "tag": metadata.get("tag"), "reasons": reasons}


def per_tag_means(details: Sequence[Mapping], key: str = "accuracy") -> dict[str, float]:
    """Mean of `key` per tag over the samples of that tag with a finite value (NaN: unscorable,
    None: absent); a tag without one is left out. The official GenEval overall is the mean of
    the six (`marble.evaluation.results.geneval_summary`)."""
    out = {}
    for tag in TAGS:
        vals = [float(d[key]) for d in details if d.get("tag") == tag and _finite(d.get(key))]
        if vals:
            out[tag] = sum(vals) / len(vals)
    return out


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
