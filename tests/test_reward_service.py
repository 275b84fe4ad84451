"""The managed UnifiedReward judge (marble.rewards.service), with the fake judge on loopback."""

from __future__ import annotations

import shlex
import sys

import pytest

from marble.rewards import service
from marble.workflow import evaluation

FAKE = f"{shlex.quote(sys.executable)} -m beds.fake_sglang --port {{port}} --idle 60"
# The job: one real UnifiedReward request through the URL the service hands over.
JOB = """
import os, sys, torch
from marble.rewards.unifiedreward import UnifiedReward
url = os.environ["MARBLE_UNIFIEDREWARD_URL"]
open(sys.argv[1], "w").write(url)
scores = UnifiedReward(retries=0).score(torch.full((2, 3, 16, 16), 0.5), ["a cat", "a dog"], [{}, {}])
assert torch.isfinite(scores).all() and ((scores >= 0.2) & (scores <= 1.0)).all(), scores
"""


def test_job_reaches_the_started_judge_which_stops_afterwards(tmp_path, monkeypatch):
    monkeypatch.delenv("MARBLE_UNIFIEDREWARD_URL", raising=False)
    url_file = tmp_path / "url"
    rc = service.run_with_server(FAKE, None, [sys.executable, "-c", JOB, str(url_file)], ready_timeout_s=60)
    assert rc == 0
    url = url_file.read_text()
    assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
    assert not service.healthy(url.removesuffix("/v1"), timeout_s=1)  # stopped with the job


def test_a_failing_job_keeps_its_exit_code_and_still_stops_the_judge(tmp_path):
    rc = service.main(["--server", FAKE, "--ready-timeout", "60", "--",
                       sys.executable, "-c", "import sys; sys.exit(5)"])
    assert rc == 5


def test_a_server_that_dies_before_ready_is_an_error():
    dead = f"{shlex.quote(sys.executable)} -c 'import sys; sys.exit(4)' {{port}}"
    with pytest.raises(service.ServiceError, match="exited with code 4"):
        service.run_with_server(dead, None, [sys.executable, "-c", "pass"], ready_timeout_s=30)


def test_server_command_needs_a_port_and_keeps_paths_whole():
    with pytest.raises(service.ServiceError, match="no {port}"):
        service.server_argv("sglang --port 17140", 1, None)
    argv = service.server_argv("serve --model-path {model} --port {port}", 4321, "/w/my judge")
    assert argv == ["serve", "--model-path", "/w/my judge", "--port", "4321"]


def test_workflow_starts_the_judge_only_where_unifiedreward_is_scored():
    cfg = {"rewards": {}, "unifiedreward": {"server": "srv --port {port} --model-path {model}",
                                            "model": "hf:org/judge@" + "a" * 40, "ready_timeout_s": 60}}
    assert evaluation.service_prefix(cfg, "ocr") == ""
    words = shlex.split(evaluation.service_prefix(cfg, "drawbench"))
    assert words[:3] == ["python", "-m", "marble.rewards.service"] and words[-1] == "--"
    assert words[words.index("--server") + 1] == "srv --port {port} --model-path {model}"
    assert words[words.index("--model") + 1] == evaluation.judge_folder(cfg)
    assert evaluation.hub_models(cfg) == {evaluation.judge_folder(cfg).rsplit("/", 1)[1]:
                                          ("hf:org/judge@" + "a" * 40, False)}
    # No server configured: the client's own URL (a server started by hand), as before.
    assert evaluation.service_prefix({"rewards": {}, "unifiedreward": {"server": None}}, "drawbench") == ""
    # A dataset whose configured rewards leave unifiedreward out starts nothing.
    assert evaluation.service_prefix({**cfg, "rewards": {"drawbench": ["pickscore"]}}, "drawbench") == ""
