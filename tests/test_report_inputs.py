"""`marble report` on missing, foreign or damaged inputs: sections that say how to make what is
missing, a folder that is not a report left alone, a rerun after Snakemake deleted the declared
outputs, metrics lines read strictly. (Split from tests/test_report.py.)"""

from __future__ import annotations

import numpy as np
import pytest
from test_report import DOWN, UP, write_run

from marble.report.cli import main
from marble.report.loading import ReportInputError, read_metrics


def test_missing_inputs_give_sections_saying_how_to_make_them(tmp_path):
    write_run(tmp_path / "runs", "ws", "weighted_sum", {"bright": UP, "sat": UP, "color": DOWN})
    out = tmp_path / "report"
    from marble.cli import main as marble_cli

    assert marble_cli(["report", "--runs", str(tmp_path / "runs"), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert "Missing: no evaluation summary" in md and "python -m marble.evaluation.summary" in md
    assert "Missing: no bench results" in md and "marble bench step" in md
    assert "Missing: no eval folder" in md
    assert "Missing: no run logged `cos_min`" in md
    assert "No run logged `alpha/<name>`" in md
    assert "(a) Every reward rises under MARBLE: no difference larger than inf. No MARBLE run." in md
    assert "Not applicable: no two MARBLE runs" in md
    # nothing of ours beside the paper's numbers: they are tables that say so, never bars alone
    assert sorted(p.name for p in (out / "figures").iterdir()) == ["training_rewards.png"]
    assert "Table 1: nothing of ours measured for it" in md
    assert "Table 1, published (not measured here)" in md
    # a second run replaces the report folder as a whole
    assert main(["--runs", str(tmp_path / "runs"), "--out", str(out)]) == 0


def test_refuses_to_replace_a_folder_that_is_not_a_report(tmp_path, capsys):
    (tmp_path / "runs").mkdir()
    precious = tmp_path / "results"
    precious.mkdir()
    (precious / "keep.txt").write_text("x")
    assert main(["--runs", str(tmp_path / "runs"), "--out", str(precious)]) == 2  # one line, no traceback
    assert "holds keep.txt, which no report writes" in capsys.readouterr().err
    assert (precious / "keep.txt").exists()
    (precious / "report.md").write_text("an old report")  # a report.md does not make it one
    assert main(["--runs", str(tmp_path / "runs"), "--out", str(precious)]) == 2
    assert "holds keep.txt" in capsys.readouterr().err
    assert (precious / "keep.txt").exists()


def test_rerun_after_snakemake_deleted_the_declared_outputs(tmp_path):
    """Snakemake removes report.md and report.html before rerunning make_report; what is
    left (figures/, tables/, verdict.json) is still a report folder, replaced as a whole."""
    (tmp_path / "runs").mkdir()
    out = tmp_path / "report"
    assert main(["--runs", str(tmp_path / "runs"), "--out", str(out)]) == 0
    (out / "report.md").unlink()
    (out / "report.html").unlink()
    (out / "figures").mkdir(exist_ok=True)
    (out / "figures" / "stale.png").write_bytes(b"old")
    assert main(["--runs", str(tmp_path / "runs"), "--out", str(out)]) == 0
    assert (out / "report.md").is_file() and not (out / "figures" / "stale.png").exists()


def test_read_metrics_errors_duplicates_and_torn_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "reward/a": null}\n{"step": 2, "reward/a": NaN}\n'
                    '{"step": 1, "reward/a": 0.5}\n{"step": 3, "rew')
    frame = read_metrics(path)
    assert list(frame["step"]) == [1, 2]
    assert frame.loc[0, "reward/a"] == 0.5  # the re-logged step after a resume wins
    assert np.isnan(frame.loc[1, "reward/a"])
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ReportInputError, match=r"metrics.jsonl:2: invalid JSON"):
        read_metrics(path)
