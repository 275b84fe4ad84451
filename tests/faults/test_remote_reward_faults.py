"""UnifiedReward against a flaky judge on 127.0.0.1 (beds.fake_sglang's faults):
a failed request is NaN and flagged, never a score; evaluation stores it as missing, counts
it in average_scores.json and the next run fills it."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest
import torch
from PIL import Image

from marble import evaluate
from marble.rewards import build
from marble.rewards.unifiedreward import QUESTION, REFERENCE_MODEL_NAME
from beds.fake_sglang import FakeSglangServer, judge_score

PROMPTS = ["a red bicycle", "a foggy forest"]


def reward(url: str, **options):
    return build("unifiedreward", base_url=url, image_size=16, concurrency=1, backoff_s=0.01,
                 **{"retries": 0, "timeout_s": 5.0, **options})


def expected(prompt: str) -> float:
    return judge_score(QUESTION.format(prompt=prompt)) / 5


def test_a_503_then_ok_is_retried_to_a_score():
    with FakeSglangServer(idle_s=30, faults=["503"]) as server:
        scorer = reward(server.url, retries=1)
        out = scorer(torch.rand(1, 3, 8, 8), PROMPTS[:1])
    assert out.item() == pytest.approx(expected(PROMPTS[0])) and not scorer.last_failed.any()
    assert server.requests == 2


def test_a_503_after_its_retries_is_nan_and_flagged_not_zero():
    # reference_rules (the default) once scored a failed request 0, a valid-looking score.
    with FakeSglangServer(idle_s=30, faults=["503"]) as server:
        scorer = reward(server.url)
        out = scorer(torch.rand(2, 3, 8, 8), PROMPTS)
    assert math.isnan(out[0].item()) and out[1].item() == pytest.approx(expected(PROMPTS[1]))
    assert scorer.last_failed.tolist() == [True, False]
    assert scorer.counters()["failed_http_503"] == 1 and scorer.failures == 1


def test_a_trickling_server_is_cut_at_the_whole_request_deadline():
    # Each byte comes well within timeout_s, so a per-read timeout never fires.
    with FakeSglangServer(idle_s=30, faults=["trickle"], trickle_s=0.03) as server:
        scorer = reward(server.url, timeout_s=0.3, max_failure_fraction=1.0)
        out = scorer(torch.rand(1, 3, 8, 8), PROMPTS[:1])
    assert math.isnan(out.item()) and scorer.last_failed.tolist() == [True]
    assert scorer.counters()["failed_timeout"] == 1


def test_an_undecodable_gzip_body_is_a_failed_request():
    with FakeSglangServer(idle_s=30, faults=["bad_gzip"]) as server:
        scorer = reward(server.url)
        out = scorer(torch.rand(2, 3, 8, 8), PROMPTS)
    assert math.isnan(out[0].item()) and scorer.last_failed.tolist() == [True, False]
    assert scorer.counters()["failed_decoding"] == 1


def test_a_score_outside_the_judges_scale_is_nan_with_a_warning(caplog):
    with FakeSglangServer(idle_s=30, faults=["score:99999", "score:0"]) as server:
        scorer = reward(server.url, reference_rules=False, max_failure_fraction=1.0)
        with caplog.at_level(logging.WARNING, logger="marble.rewards.unifiedreward"):
            out = scorer(torch.rand(3, 3, 8, 8), [*PROMPTS, "a third"])
    assert math.isnan(out[0].item()) and math.isnan(out[1].item())
    assert out[2].item() == pytest.approx(expected("a third"))
    assert scorer.counters()["failed_out_of_scale"] == 2 and "99999" in caplog.text
    # A judgement, not a failed request: a rerun at temperature 0 would get the same reply.
    assert not scorer.last_failed.any()


def test_request_names_the_reference_model():
    # flow_grpo/rewards.py `unifiedreward_score_sglang`: model="UnifiedReward-7b-v1.5".
    body = build("unifiedreward", base_url="http://127.0.0.1:9/v1").payload(Image.new("RGB", (8, 8)), "x")
    assert body["model"] == REFERENCE_MODEL_NAME == "UnifiedReward-7b-v1.5"


def test_a_503_during_evaluation_leaves_nan_and_a_rerun_fills_it(tmp_path, capsys):
    raw, out = tmp_path / "raw", tmp_path / "eval"
    (raw / "drawbench").mkdir(parents=True)
    (raw / "drawbench" / "test.txt").write_text("\n".join(PROMPTS) + "\n")
    (out / "images").mkdir(parents=True)
    for i in range(2):  # score saved images: no model is loaded
        Image.fromarray((np.random.default_rng(i).random((16, 16, 3)) * 255).astype(np.uint8)).save(
            out / "images" / f"{i:05d}.jpg")
    with FakeSglangServer(idle_s=30, faults=["503"]) as server:
        options = json.dumps({"unifiedreward": {"base_url": server.url, "retries": 0, "concurrency": 1,
                                                "image_size": 16}})
        argv = ["--model_path", "never-loaded", "--dataset", "drawbench", "--data_dir", str(raw),
                "--output_dir", str(out), "--batch_size", "2", "--rewards", "toy_brightness,unifiedreward",
                "--reward_options", options, "--skip_generation"]
        assert evaluate.main(argv) == evaluate.EXIT_INCOMPLETE  # outputs written, not done: a workflow reruns
        rows = [json.loads(line) for line in (out / "evaluation_results.jsonl").read_text().splitlines()]
        avg = json.loads((out / "average_scores.json").read_text())
        assert [r["scores"]["unifiedreward"] for r in rows].count(None) == 1  # null, not 0.0
        assert sum(r["failed"] == ["unifiedreward"] for r in rows) == 1
        assert avg["failed_unifiedreward"] == 1 and avg["nan_unifiedreward"] == 1 and avg["n_unifiedreward"] == 1
        assert "1 unifiedreward requests failed" in capsys.readouterr().err
        assert evaluate.main(argv) == 0  # the rerun retries exactly the failed sample
        assert server.requests == 3
    avg = json.loads((out / "average_scores.json").read_text())
    assert avg["failed_unifiedreward"] == 0 and avg["n_unifiedreward"] == 2
    assert avg["unifiedreward"] == pytest.approx(sum(expected(p) for p in PROMPTS) / 2)
