"""Typed reads and one-line errors (issue 38 items 4-5), tried through the commands a user runs.

Each fault is a file a careful user or a hostile filesystem hands in: a prompt file whose text
carries what no one sees (a byte-order mark, a NUL, an escape sequence, a Unicode line break),
a training table whose reward mask holds the strings "True"/"False" (pandas reads both as true),
a results row or a metrics line whose value is not what its key means, an output path that is
a file, and a disk that fills in the final write. Each must end in one line naming file, line
(or row) and key, exit non-zero, and never a traceback or a silently different result.
"""

from __future__ import annotations

import errno
import json
import os

import pytest

from marble import evaluate, train
from marble.data import cli as data_cli
from marble.data.records import PromptRecord, to_frame
from marble.evaluation.results import ResultsError, read_results
from marble.models import cli as models_cli
from marble.experiments import claim_cli
from marble.report import tables_cli
from marble.report import cli as report_cli


def one_line(err: str, prefix: str) -> str:
    lines = [x for x in err.splitlines() if x.startswith(prefix)]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.fault("prompt file text that changes a prompt (BOM, NUL, escape, line separator)")
@pytest.mark.parametrize("content,said", [
    ("\ufeffa cat\na dog\n".encode(), "ocr/test.txt:1: a byte-order mark"),
    (b"a cat\na\x00dog\n", "ocr/test.txt:2: control character '\\x00'"),
    (b"a cat\na \x1b[1mdog\n", "ocr/test.txt:2: control character '\\x1b'"),
    ("a cat\na\u2028dog\n".encode(), "ocr/test.txt:2: a line separator (U+2028)"),
])
def test_a_prompt_file_with_invisible_characters_is_one_line(tmp_path, capsys, content, said):
    (tmp_path / "ocr").mkdir()
    (tmp_path / "ocr" / "test.txt").write_bytes(content)
    argv = ["--model_path", "never-loaded", "--dataset", "ocr", "--data_dir", str(tmp_path), "--output_dir",
            str(tmp_path / "out"), "--rewards", "toy_brightness", "--skip_generation"]
    assert evaluate.main(argv) == 2
    line = one_line(capsys.readouterr().err, "marble evaluate")
    assert said in line and str(tmp_path) in line


def table_with(tmp_path, **columns):
    df = to_frame([PromptRecord.make("a cat", "pickscore"), PromptRecord.make("a dog", "ocr")],
                  {"toy_brightness": [True, True]})
    for name, values in columns.items():
        df[name] = values
    path = tmp_path / "train.parquet"
    df.to_parquet(path)
    return path


@pytest.mark.fault("training table value not what its column means")
@pytest.mark.parametrize("column,values,said", [
    ("applies__toy_brightness", ["False", "False"], "row 0: `applies__toy_brightness` must be true or false"),
    ("applies__toy_brightness", [True, None], "row 1: `applies__toy_brightness` must be true or false"),
    ("metadata", ["{}", "not json"], "row 1: `metadata` is not JSON"),
    ("prompt", ["a cat", "a\x00dog"], "row 1: `prompt`: control character"),
])
def test_a_training_table_with_a_mistyped_value_is_one_line_from_marble_train(tmp_path, capsys, column,
                                                                                values, said):
    table = table_with(tmp_path, **{column: values})
    with pytest.raises(SystemExit) as exc:
        train.main(["--preset", "tiny", "--output-dir", str(tmp_path / "run"), "--set", "model.path=random:tiny",
                    "--set", f"data.train={table}", "--set", "rewards=[{name: toy_brightness}]"])
    line = one_line(capsys.readouterr().err, "marble train")
    assert exc.value.code == 2 and said in line and str(table) in line
    assert not (tmp_path / "run").exists()  # refused before the first write
    assert models_cli.main(["pretrain", "--table", str(table), "--out", str(tmp_path / "pre")]) == 2
    assert said in one_line(capsys.readouterr().err, "marble models pretrain")


@pytest.mark.fault("results row value not what its key means")
@pytest.mark.parametrize("key,value", [("not_applicable", "pickscore,ocr"), ("failed", "ocr"),
                                       ("metadata", "counting"), ("prompt_id", 7),
                                       ("metadata.tag", {"source": "geneval", "tag": "countin"}),
                                       ("image_sha256", "0" * 63), ("image_sha256", 7)])
def test_an_edited_results_row_names_file_line_and_key(tmp_path, key, value):
    path = tmp_path / "evaluation_results.jsonl"
    row = {"sample_id": 0, "rev": 1, "prompt_id": "ab", "prompt": "a cat", "metadata": {},
           "scores": {"ocr": None}, "not_applicable": ["ocr"], "failed": [], "image_path": None}
    edited = {**row, "sample_id": 1, key.split(".")[0]: value}
    path.write_text(json.dumps(row) + "\n" + json.dumps(edited) + "\n")
    with pytest.raises(ResultsError) as err:
        read_results(path)
    assert str(err.value).startswith(f"{path}:2: sample 1: `{key}`") and "\n" not in str(err.value)


def a_run(runs, name="a", lines=None):
    run = runs / name
    run.mkdir(parents=True)
    lines = lines or [{"step": s, "reward/ocr": 0.1 * s} for s in (1, 2, 3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run


@pytest.mark.fault("metrics line value not what its key means (report)")
@pytest.mark.parametrize("bad,said", [({"step": 2, "reward/ocr": "0.7"}, "`reward/ocr` = '0.7' is not a number"),
                                      ({"step": "2", "reward/ocr": 0.2}, "`step` must be an integer"),
                                      ({"step": 2, "reward/ocr": "nan?"}, "`reward/ocr` = 'nan?'")])
def test_a_mistyped_metrics_line_is_one_line_from_marble_report(tmp_path, capsys, bad, said):
    run = a_run(tmp_path / "runs", lines=[{"step": 1, "reward/ocr": 0.1}, bad])
    assert report_cli.main(["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "report")]) == 2
    line = one_line(capsys.readouterr().err, "marble report")
    assert f"{run / 'metrics.jsonl'}:2: {said}" in line
    assert not (tmp_path / "report").exists()
    assert tables_cli.main(["harmony", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "t")]) == 2
    assert said in one_line(capsys.readouterr().err, "marble tables harmony")


def tried(fault_trials, capsys, what: str, code: int, want: int, prefix: str, said: str) -> None:
    """Record one command's injection: its exit status, and one line saying `said`."""
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith(prefix)]
    fault_trials.record(code == want and len(lines) == 1 and said in lines[0] and "Traceback" not in err,
                        f"{what}: exit {code}, {lines or err[-300:]!r}")


@pytest.mark.fault("output path that is a file")
def test_an_output_path_that_is_a_file_is_one_line(tmp_path, capsys, fault_trials):
    a_run(tmp_path / "runs")
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    runs = str(tmp_path / "runs")
    for out in (afile, afile / "report"):
        code = report_cli.main(["--runs", runs, "--out", str(out)])
        tried(fault_trials, capsys, f"marble report --out {out.name}", code, 2, "marble report", "not a folder")
    commands = [("marble data tiny", 1, lambda: data_cli.main(["tiny", "--out", str(afile)])),
                ("marble data embed", 1, lambda: data_cli.main(["embed", "--table", "t.parquet", "--model",
                                                                "random:tiny", "--out", str(afile)])),
                ("marble models tiny", 2, lambda: models_cli.main(["tiny", "--out", str(afile)])),
                ("marble tables harmony", 2, lambda: tables_cli.main(["harmony", "--runs", runs, "--out", str(afile)])),
                ("marble report claim", 2, lambda: claim_cli.main(["--no-arms", "--out", str(afile)]))]
    for prog, want, command in commands:
        tried(fault_trials, capsys, prog, command(), want, prog, f"--out {afile} is a file, not a folder")
    fault_trials.record(afile.read_text() == "mine\n", "the file stands untouched")
    assert not fault_trials.lost, fault_trials.lost


def full_disk(monkeypatch):
    """Every rename fails as on a full disk: the atomic writes' last step (marble.runtime.io)."""
    def replace(src, dst, *, src_dir_fd=None, dst_dir_fd=None):  # os.replace's signature
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))

    monkeypatch.setattr("marble.runtime.io.os.replace", replace)


@pytest.mark.fault("full disk in a final write (report, claim, data)")
def test_a_full_disk_in_the_final_write_is_one_line(tmp_path, capsys, monkeypatch, fault_trials):
    a_run(tmp_path / "runs")
    full_disk(monkeypatch)
    nospace = "No space left on device: "
    tried(fault_trials, capsys, "marble report",
          report_cli.main(["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "report")]),
          2, "marble report", nospace)
    fault_trials.record(not (tmp_path / "report").exists(), "no report half written")
    tried(fault_trials, capsys, "marble data tiny", data_cli.main(["tiny", "--out", str(tmp_path / "tiny")]),
          1, "marble data tiny", nospace)
    tried(fault_trials, capsys, "marble tables harmony",
          tables_cli.main(["harmony", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "tables")]),
          2, "marble tables harmony", nospace)
    from marble.evaluation import summary

    (tmp_path / "eval" / "r" / "c" / "ocr").mkdir(parents=True)
    (tmp_path / "eval" / "r" / "c" / "ocr" / "average_scores.json").write_text('{"num_samples": 1, "ocr": 0.5}')
    tried(fault_trials, capsys, "marble eval summary",
          summary.main(["--eval-dir", str(tmp_path / "eval"), "--out-csv", str(tmp_path / "s.csv"),
                        "--out-md", str(tmp_path / "s.md")]), 2, "marble eval summary", nospace)

    def build(args):  # the claim's real signature; its arms need trained runs, not what is tried here
        return {"sentences": ["s"], "arms": []}

    def write_figures(v, folder):
        return {}

    monkeypatch.setattr(claim_cli, "build", build)
    monkeypatch.setattr(claim_cli, "write_figures", write_figures)
    tried(fault_trials, capsys, "marble report claim",
          claim_cli.main(["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "claim")]),
          2, "marble report claim", nospace)
    assert not fault_trials.lost, fault_trials.lost


@pytest.mark.fault("missing model path says not found")
def test_a_missing_model_path_says_not_found(tmp_path, capsys):
    table = table_with(tmp_path)
    missing = tmp_path / "no-model"
    assert data_cli.main(["embed", "--table", str(table), "--model", str(missing), "--out", str(tmp_path / "e")]) == 1
    line = one_line(capsys.readouterr().err, "marble data embed")
    assert f"{str(missing)!r} not found" in line
    with pytest.raises(SystemExit):
        train.main(["--preset", "tiny", "--output-dir", str(tmp_path / "run"), "--set", f"model.path={missing}",
                    "--set", f"data.train={table}"])
    assert "not found" in one_line(capsys.readouterr().err, "marble train")



@pytest.mark.fault("report and verdict read a run still training")
def test_a_run_short_of_its_max_steps_is_left_out_and_named(tmp_path, capsys):
    import yaml

    runs = tmp_path / "runs"
    for name, last in (("done", 4), ("live", 2)):
        run = a_run(runs, name, [{"step": s, "reward/ocr": 0.1 * s} for s in range(1, last + 1)])
        (run / "config.yaml").write_text(yaml.safe_dump({"train": {"max_steps": 4, "seed": 1},
                                                         "rewards": [{"name": "ocr"}]}))
    assert report_cli.main(["--runs", str(runs), "--out", str(tmp_path / "report")]) == 0
    verdict = json.loads((tmp_path / "report" / "verdict.json").read_text())
    assert list(verdict["runs_left_out"]) == ["live"]
    assert "step 2 of train.max_steps 4" in verdict["runs_left_out"]["live"]
    assert list(verdict["reward_change"]) == ["done"]  # measured: the complete run only
    assert "Left out (not complete): `live`" in (tmp_path / "report" / "report.md").read_text()
    assert "`live`" in capsys.readouterr().out
    (runs / "live" / "train_summary.json").write_text("{}")  # it ended (every 3rd step logged)
    (runs / "sparse").mkdir()
    (runs / "sparse" / "metrics.jsonl").write_text(json.dumps({"step": 3, "reward/ocr": 0.3}) + "\n")
    (runs / "sparse" / "config.yaml").write_text(yaml.safe_dump({"train": {"max_steps": 4, "log_every": 3}}))
    assert report_cli.main(["--runs", str(runs), "--out", str(tmp_path / "report")]) == 0
    assert json.loads((tmp_path / "report" / "verdict.json").read_text())["runs_left_out"] == {}


@pytest.mark.fault("claim verdict reads a run still training")
def test_the_claim_leaves_out_a_run_short_of_its_max_steps_and_names_it(tmp_path):
    import yaml

    runs = tmp_path / "runs"
    for name, last in (("marble_n5-s1", 4), ("weighted_sum-s1", 2)):
        run = a_run(runs, name, [{"step": s, "reward/ocr": 0.1 * s, "reward_applicable/ocr": 4}
                                 for s in range(1, last + 1)])
        (run / "config.yaml").write_text(yaml.safe_dump({"train": {"max_steps": 4, "seed": 1},
                                                         "rewards": [{"name": "ocr"}]}))
        (run / "eval.jsonl").write_text("".join(json.dumps({"step": s, "eval_reward/ocr": 0.1 * s}) + "\n"
                                                for s in (0, last)))
    measures, *_, left_out, _machines = claim_cli.collect(runs, None)
    assert [m.arm for m in measures] == ["marble_n5"]
    assert list(left_out) == ["weighted_sum-s1"] and "step 2 of train.max_steps 4" in left_out["weighted_sum-s1"]


@pytest.mark.fault("evaluation averages and summary value not what the key means")
def test_a_mistyped_average_or_summary_value_is_one_line(tmp_path, capsys):
    from marble.evaluation import summary
    from marble.report.loading import ReportInputError, load_eval_summary

    folder = tmp_path / "eval" / "run" / "checkpoint-4" / "ocr"
    folder.mkdir(parents=True)
    (folder / "average_scores.json").write_text(json.dumps({"num_samples": 2, "ocr": "0.7"}))
    argv = ["--eval-dir", str(tmp_path / "eval"), "--out-csv", str(tmp_path / "s.csv"),
            "--out-md", str(tmp_path / "s.md")]
    assert summary.main(argv) == 2
    line = one_line(capsys.readouterr().err, "marble eval summary")
    assert f"{folder / 'average_scores.json'}: `ocr` = '0.7' is not a number" in line
    assert not (tmp_path / "s.csv").exists()
    (tmp_path / "summary.csv").write_text("run,checkpoint,dataset,metric,value\nr,c,ocr,ocr,0.5\nr,c,ocr,clip,high\n")
    with pytest.raises(ReportInputError, match=r"summary.csv:3: `value` = 'high' is not a number"):
        load_eval_summary(tmp_path / "summary.csv")


@pytest.mark.fault("a stage's reward applies to no prompt of its sources (error at start)")
@pytest.mark.parametrize("ocr_rows,said", [
    (False, "stage 'ocr': `stages[2].sources` ['ocr'] have no rows"),
    (True, "reward 'toy_text_contrast' of stage 'ocr' applies to no prompt of its sources ['ocr']"),
])
def test_a_stage_that_would_train_on_nothing_is_refused_at_start(tmp_path, capsys, monkeypatch, ocr_rows, said):
    """tiny_sequential's third stage draws ocr rows for toy_text_contrast: a table without ocr rows,
    or whose ocr rows the reward does not score, failed only when that stage began (step 20)."""
    def run_training(cfg, out_dir, device=None, progress=True, stop=None, fresh=False,
                     adopt=False):  # the real signature: reached only when the start let it through
        raise AssertionError(f"the start let {out_dir} through to training")

    monkeypatch.setattr("marble.training.run.run_training", run_training)
    sources = ["pickscore", "geneval"] + (["ocr"] if ocr_rows else [])
    rows = [PromptRecord.make(f"prompt {i} of {s}", s) for s in sources for i in range(4)]
    names = ("toy_brightness", "toy_saturation", "toy_color_match", "toy_text_contrast")
    masks = {n: [n != "toy_text_contrast" or r.source == "pickscore" for r in rows] for n in names}
    table = tmp_path / "train.parquet"
    to_frame(rows, masks).to_parquet(table)
    with pytest.raises(SystemExit) as exc:
        train.main(["--preset", "tiny_sequential", "--output-dir", str(tmp_path / "run"),
                    "--set", "model.path=random:tiny", "--set", f"data.train={table}", "--set", "train.eval_every=0"])
    line = one_line(capsys.readouterr().err, "marble train")
    assert exc.value.code == 2 and said in line
    assert not (tmp_path / "run").exists()
