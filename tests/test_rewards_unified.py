"""UnifiedReward client against a real HTTP server on 127.0.0.1 (no sglang needed)."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from marble.rewards import RewardServiceError, build
from marble.rewards.unifiedreward import QUESTION, parse_final_score

# sha256 of the reference's judge prompt (aim-uofa/MARBLE flow_grpo/rewards.py, `question`),
# computed from the reference text: the prompt is part of the reward's definition.
REFERENCE_QUESTION_SHA256 = "d68ab1dcf4dc3a39ec5dfab963d17fe30a6e5f713eb49f743ed88a4c8ce4317f"


class Judge(BaseHTTPRequestHandler):
    """Replies by the caption: good -> a score, garbage -> no score, error -> 500, slow -> late."""

    seen_auth: list[str] = []

    def do_POST(self):  # noqa: N802 - http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Judge.seen_auth.append(self.headers.get("Authorization", ""))
        content = body["messages"][0]["content"]
        assert content[0]["image_url"]["url"].startswith("data:image/png;base64,")
        assert body["temperature"] == 0.0
        text = content[1]["text"]
        prefix, suffix = QUESTION.split("{prompt}")
        assert text.startswith(prefix) and text.endswith(suffix)
        caption = text[len(prefix) : len(text) - len(suffix)]
        if "error" in caption:
            self.send_response(500)
            self.end_headers()
            return
        if "slow" in caption:
            time.sleep(1.5)
        reply = "The image is fine.\nFinal Score: 4.5" if "good" in caption else "I cannot say."
        data = json.dumps({"choices": [{"message": {"content": reply}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up on the slow reply: that is the case under test

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Judge)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_question_is_the_reference_prompt_verbatim():
    import hashlib

    assert hashlib.sha256(QUESTION.encode()).hexdigest() == REFERENCE_QUESTION_SHA256
    assert QUESTION.format(prompt="a cat").endswith("Text Caption: [a cat]")


def test_parse_final_score():
    assert parse_final_score("blah\nFinal Score: 3.5") == 3.5
    assert parse_final_score("Final Score: **4**") == 4.0
    assert parse_final_score("Final Score: 2\nFinal Score: 5") == 5.0  # lenient: the last one
    assert math.isnan(parse_final_score("no score here"))
    assert math.isnan(parse_final_score(""))
    # The reference's rule: first match, a leading digit 1-5, case-sensitive, no markdown.
    assert parse_final_score("Final Score: 2\nFinal Score: 5", reference=True) == 2.0
    assert parse_final_score("Final Score: 4.25", reference=True) == 4.25
    assert math.isnan(parse_final_score("Final Score: **4**", reference=True))
    assert math.isnan(parse_final_score("final score: 4", reference=True))
    assert math.isnan(parse_final_score("Final Score: 7", reference=True))


def test_reference_rules_scale_by_five_unparsable_zero_failed_request_nan(server_url, monkeypatch):
    monkeypatch.setenv("MARBLE_UNIFIEDREWARD_API_KEY", "test-key")
    monkeypatch.delenv("MARBLE_UNIFIEDREWARD_URL", raising=False)
    reward = build("unifiedreward", base_url=server_url, timeout_s=0.5, retries=0, max_failure_fraction=0.9,
                   image_size=32)
    out = reward(torch.rand(4, 3, 16, 16), ["good dog", "garbage", "error", "good cat"])
    # 4.5 / 5; a reply without a score -> 0 as the reference; a failed request NaN, never 0
    assert out.tolist()[:2] == pytest.approx([0.9, 0.0]) and math.isnan(out[2]) and out[3] == pytest.approx(0.9)
    assert reward.last_failed.tolist() == [False, False, True, False]
    counters = reward.counters()
    assert reward.failures == 2 and counters["failed_unparsable"] == 1 and counters["failed_http_500"] == 1


def test_reference_rules_do_not_abort_on_unparsable_replies(server_url):
    reward = build("unifiedreward", base_url=server_url, retries=0, max_failure_fraction=0.5, image_size=32)
    assert reward(torch.rand(3, 3, 16, 16), ["garbage", "garbage", "good"]).tolist() == pytest.approx([0, 0, 0.9])
    assert reward.counters()["failed_unparsable"] == 2


def test_base_url_from_environment(server_url, monkeypatch):
    monkeypatch.setenv("MARBLE_UNIFIEDREWARD_URL", server_url)
    reward = build("unifiedreward", image_size=32)
    assert reward.url == server_url + "/chat/completions"
    assert reward(torch.rand(1, 3, 16, 16), ["good"]).item() == pytest.approx(0.9)
    with pytest.raises(ValueError, match="score_scale"):
        build("unifiedreward", score_scale=0)


def test_mixed_replies_are_nan_and_counted(server_url, monkeypatch):
    monkeypatch.setenv("MARBLE_UNIFIEDREWARD_API_KEY", "test-key")
    reward = build("unifiedreward", base_url=server_url, timeout_s=0.5, retries=1, backoff_s=0.01,
                   max_failure_fraction=0.9, image_size=32, reference_rules=False, score_scale=1.0)
    prompts = ["good dog", "garbage", "error", "slow good", "good cat"]
    out = reward(torch.rand(5, 3, 16, 16), prompts)
    assert out.dtype == torch.float32 and out.shape == (5,)
    assert out[0].item() == 4.5 and out[4].item() == 4.5
    assert all(math.isnan(out[i].item()) for i in (1, 2, 3))
    counters = reward.counters()
    assert counters["failed_unparsable"] == 1
    assert counters["failed_http_500"] == 1
    assert counters["failed_timeout"] == 1
    assert reward.failures == 3
    assert "Bearer test-key" in Judge.seen_auth


def test_abort_threshold_raises(server_url):
    lenient = build("unifiedreward", base_url=server_url, retries=0, max_failure_fraction=0.5, image_size=32,
                    reference_rules=False)
    with pytest.raises(RewardServiceError, match="2/3 requests .* failed"):
        lenient(torch.rand(3, 3, 16, 16), ["garbage", "error", "good"])
    reference = build("unifiedreward", base_url=server_url, retries=0, max_failure_fraction=0.5, image_size=32)
    with pytest.raises(RewardServiceError, match="2/3 requests .* failed"):
        reference(torch.rand(3, 3, 16, 16), ["error", "error", "good"])


def test_connection_refused_is_counted_then_aborts():
    url = f"http://127.0.0.1:{closed_port()}/v1"
    lenient = build("unifiedreward", base_url=url, retries=1, backoff_s=0.01, max_failure_fraction=1.0, image_size=32,
                    reference_rules=False)
    out = lenient(torch.rand(2, 3, 16, 16), ["good", "good"])
    assert torch.isnan(out).all() and lenient.counters()["failed_connection"] == 2
    strict = build("unifiedreward", base_url=url, retries=0, image_size=32)
    with pytest.raises(RewardServiceError, match="is the sglang server up"):
        strict(torch.rand(2, 3, 16, 16), ["good", "good"])
