"""Faults in the append-only logs (issue 21, item 3): a torn tail never blocks a run.

Before the fix, a row appended after a torn fragment (disk full, kill mid-write) glued
onto it, and every later read raised `ResultsError ...jsonl:N`; in training a torn
metrics line before the first checkpoint crashed the run after training and every rerun,
and a kill during the first checkpoint write left each step logged twice.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from marble.evaluation.results import read_results
from marble.runtime.io import append_jsonl
from marble.training.metrics import MetricsLog
from marble.training.trainer import Trainer


def _rows(path: Path, n: int) -> None:
    for i in range(n):
        append_jsonl(path, {"sample_id": i, "scores": {"toy": 0.5}})


@pytest.mark.fault("torn results line, then a rerun appends")
def test_results_survive_an_append_after_a_torn_tail(tmp_path):
    path = tmp_path / "evaluation_results.jsonl"
    _rows(path, 3)
    with open(path, "ab") as fh:
        fh.write(b'{"sample_id": 3, "sco')  # a full disk stopped the write here
    with pytest.warns(UserWarning, match=rf"{path}:4: ignoring a torn last line"):
        assert sorted(read_results(path)) == [0, 1, 2]
    with pytest.warns(UserWarning, match=rf"{path}:4: cutting off a torn last line"):
        append_jsonl(path, {"sample_id": 3, "scores": {"toy": 0.25}})
    assert read_results(path)[3]["scores"] == {"toy": 0.25}  # no warning: the file is whole
    assert path.read_bytes().count(b"\n") == 4


@pytest.mark.fault("a last line that lost only its newline")
def test_a_complete_last_line_without_newline_is_kept(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}')
    MetricsLog(path, backends=["jsonl"]).log({"step": 3})
    assert [r["step"] for r in MetricsLog(path).read()] == [1, 2, 3]


@pytest.mark.fault("torn metrics line before the first checkpoint")
def test_metrics_torn_before_the_first_checkpoint_are_cut_on_resume(tmp_path):
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path, backends=["jsonl"])
    log.log({"step": 1, "loss": 0.5})
    with open(path, "ab") as fh:
        fh.write(b'{"step": 2, "lo')  # killed mid-line, no checkpoint written yet
    # Trainer.resume of a run with no checkpoint yet: the earlier attempt's lines go.
    # (eval_log None: a run without held-out evaluation, as Trainer.__init__ sets it)
    trainer = types.SimpleNamespace(checkpoints=types.SimpleNamespace(resume=lambda: None),
                                    metrics=log, eval_log=None)
    with pytest.warns(UserWarning, match="torn last line"):
        assert Trainer.resume(trainer) is None
    assert path.read_text() == ""
    log.log({"step": 1, "loss": 0.5})  # the rerun logs step 1 once
    assert [r["step"] for r in log.read()] == [1]
    assert json.loads(path.read_text()) == {"step": 1, "loss": 0.5}
