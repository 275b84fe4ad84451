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


# A metrics.jsonl line whose value is not what its key means: a resume used to truncate by a
# step compared as written ("3" > 2 raises in Python, 3.5 and true pass as numbers) and judge
# the run (marble.training.outcome) from a metric "0.5" or a list taken as is.
MISTYPED_METRICS = [
    ({"step": "3", "loss": 0.5}, "`step` must be an integer"),
    ({"step": 3.5, "loss": 0.5}, "`step` must be an integer"),
    ({"step": True, "loss": 0.5}, "`step` must be an integer"),
    ({"step": 3, "reward/toy": "0.5"}, "`reward/toy` = '0.5' is not a number"),
    ({"step": 3, "reward/toy": [0.5]}, "`reward/toy` = [0.5] is not a number"),
    ([3, 0.5], "expected a JSON object, got list"),
]


@pytest.mark.fault("metrics line value not what its key means (resume)")
@pytest.mark.parametrize("bad,said", MISTYPED_METRICS)
def test_a_mistyped_metrics_line_stops_the_resume_naming_file_line_and_key(tmp_path, bad, said):
    from marble.training.metrics import MetricsFileError
    from marble.training.run_dir import TrainError

    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": 1, "reward/toy": 0.25}), json.dumps(bad), json.dumps({"step": 4, "loss": 0.5})]
    path.write_text("".join(x + "\n" for x in lines))
    before = path.read_bytes()
    trainer = types.SimpleNamespace(checkpoints=types.SimpleNamespace(resume=lambda: None),
                                    metrics=MetricsLog(path, backends=["jsonl"]), eval_log=None, step=2)
    with pytest.raises(MetricsFileError) as err:  # resumed from no checkpoint: truncate_after(0)
        Trainer.resume(trainer)
    assert isinstance(err.value, TrainError)  # `marble train` prints it in one line, exit 2
    assert str(err.value).startswith(f"{path}:2: {said}")
    assert "\n" not in str(err.value)
    assert path.read_bytes() == before  # nothing kept or dropped: the file is the user's to fix
    for read in (MetricsLog(path).read, lambda: MetricsLog(path).truncate_after(2)):
        with pytest.raises(MetricsFileError, match=rf"{path}:2: "):
            read()  # what the end of a run judges (failed_run_reason), and a resume at step 2


@pytest.mark.fault("metrics values the trainer writes (NaN, Infinity, flags, text) read back")
def test_the_trainers_own_metrics_lines_read_back_typed(tmp_path):
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path, backends=["jsonl"])
    records = [{"step": 1, "reward/toy": float("nan"), "grad_norm": float("inf"), "full_solve": True,
                "balancer": "marble", "stage_name": "a", "diag_micro": [{"cos": 0.5}], "loss": None},
               {"step": 2, "reward/toy": 0.5, "reward_applicable/toy": 3}]
    for record in records:
        log.log(record)
    read = MetricsLog(path).read()
    # strict JSON (issue 49): NaN and +-inf are written as null, which a reader takes as "no value"
    assert [r["step"] for r in read] == [1, 2] and read[0]["reward/toy"] is None
    assert read[0]["grad_norm"] is None and read[0]["full_solve"] is True
    assert "NaN" not in path.read_text() and "Infinity" not in path.read_text()
    with open(path, "ab") as fh:
        fh.write(b'{"step": 3, "reward/toy": "0.')  # a torn last line is still a kill mid-append
    with pytest.warns(UserWarning, match="torn last line"):
        assert MetricsLog(path).truncate_after(2) == 1
    assert [r["step"] for r in MetricsLog(path).read()] == [1, 2]


@pytest.mark.fault("metrics line value not what its key means (marble train resume)")
def test_marble_train_resuming_over_a_mistyped_metrics_line_is_one_line(tiny_model_dir, tmp_path, capsys):
    from marble.data.records import PromptRecord, to_frame
    from marble.train import main as train_main

    table = tmp_path / "train.parquet"
    to_frame([PromptRecord.make("a cat", "pickscore"), PromptRecord.make("a dog", "pickscore")],
             {"toy_brightness": [True, True]}).to_parquet(table)
    run = tmp_path / "run"
    sets = [f"model.path={tiny_model_dir}", f"data.train={table}", "rewards=[{name: toy_brightness}]",
            "sampling.num_steps=2", "sampling.resolution=32", "sampling.images_per_prompt=2",
            "sampling.batch_size=4", "sampling.num_batches_per_epoch=1", "train.batch_size=2",
            "train.save_every=1", "train.eval_every=0"]
    argv = ["--preset", "tiny", "--output-dir", str(run), "--no-progress", *[x for s in sets for x in ("--set", s)]]
    assert train_main(argv + ["--max-steps", "2"]) == 0
    metrics = run / "metrics.jsonl"
    whole = metrics.read_text()
    first = json.loads(whole.splitlines()[0])
    for key, value, said in (("reward/toy_brightness", "0.5", "`reward/toy_brightness` = '0.5' is not a number"),
                             ("step", "1", "`step` must be an integer")):
        edited = json.dumps({**first, key: value}) + "\n" + "".join(x + "\n" for x in whole.splitlines()[1:])
        metrics.write_text(edited)
        capsys.readouterr()
        with pytest.raises(SystemExit) as exc:
            train_main(argv + ["--max-steps", "3"])
        err = capsys.readouterr().err
        lines = [x for x in err.splitlines() if x.startswith("marble train")]
        assert exc.value.code == 2 and len(lines) == 1 and "Traceback" not in err, err
        assert lines[0].startswith(f"marble train: error: {metrics}:1: {said}"), lines
        assert metrics.read_text() == edited  # neither kept as read nor dropped: named
    metrics.write_text(whole)  # fixed: the resume goes on
    assert train_main(argv + ["--max-steps", "3"]) == 0
    assert [r["step"] for r in MetricsLog(metrics).read()] == [1, 2, 3]
