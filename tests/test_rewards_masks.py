"""Applicability masks on the real prompt files in ../shared/datasets."""

from __future__ import annotations

import json

from marble.rewards import build
from marble.rewards.base import quoted_target


class NoDetector:
    def detect(self, images):
        raise AssertionError("masks must not run the detector")


def lines(path):
    return [line.rstrip("\n") for line in path.read_text().splitlines() if line.strip()]


def test_ocr_mask_on_real_prompts(shared_dir):
    from marble.rewards.toy import ToyTextContrast

    ocr_rule = ToyTextContrast()  # same content rule as `ocr`, without loading an OCR engine
    ocr_prompts = lines(shared_dir / "datasets" / "ocr" / "test.txt")
    assert len(ocr_prompts) == 1018
    assert all(ocr_rule.applies(p, {"source": "ocr"}) for p in ocr_prompts)
    pick = lines(shared_dir / "datasets" / "pickscore" / "test.txt")
    quoted = [p for p in pick if ocr_rule.applies(p, {"source": "pickscore"})]
    assert quoted == [p for p in pick if quoted_target(p)]
    assert len(quoted) == 63  # the spec's count
    assert all('"' in p for p in quoted)


def test_ocr_reward_uses_the_same_rule(shared_dir):
    ocr = build("ocr", backend="rapidocr")
    pick = lines(shared_dir / "datasets" / "pickscore" / "test.txt")
    assert sum(ocr.applies(p, {"source": "pickscore"}) for p in pick) == 63


def test_geneval_mask_on_real_records(shared_dir):
    records = [json.loads(x) for x in lines(shared_dir / "datasets" / "geneval" / "test_metadata.jsonl")]
    assert len(records) == 2212
    geneval = build("geneval", detector=NoDetector(), color_classifier=object())
    assert all(geneval.applies(r["prompt"], {**r, "source": "geneval"}) for r in records)
    pick = lines(shared_dir / "datasets" / "pickscore" / "test.txt")
    assert not any(geneval.applies(p, {"source": "pickscore"}) for p in pick)
    color = build("toy_color_match")
    n_color = sum(color.applies(r["prompt"], r) for r in records)
    assert n_color == sum(any("color" in c for c in r["include"]) for r in records) > 0


def test_the_effective_training_mask_is_the_rule_and_the_table_column():
    """docs/ARCHITECTURE.md ("reward masks in training"): the reward's own rule NaNs what it does
    not apply to, the table's column NaNs what the table excludes; a sample enters L_k only
    where both hold (a NaN reward is a NaN advantage, masked out of the per-reward loss)."""
    import torch

    from marble.training.rollout import RewardScorer, compute_advantages

    rule = build("toy_brightness", applies_to=["ocr", "geneval"])  # rows 0-3 by rule
    table = torch.tensor([False, True, True, False, True, True])  # rows 1, 2, 4, 5 by the table
    metadata = [{"source": s} for s in ("ocr", "ocr", "geneval", "geneval", "pickscore", "pickscore")]
    images = torch.linspace(0, 1, 6).view(6, 1, 1, 1).expand(6, 3, 4, 4).contiguous()
    scorer = RewardScorer({"toy_brightness": rule}, {"toy_brightness": table})
    try:
        (future,) = scorer.submit(images, ["p"] * 6, metadata, list(range(6)))
        scores = future.result()
    finally:
        scorer.close()
    assert (~torch.isnan(scores)).tolist() == [False, True, True, False, False, False]
    adv, _ = compute_advantages(scores[:, None], torch.tensor([0, 0, 0, 0, 1, 1]), [1.0])
    assert (~torch.isnan(adv[:, 0])).tolist() == [False, True, True, False, False, False]
