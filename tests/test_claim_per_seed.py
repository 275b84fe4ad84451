"""Issue 47 items 3 and 5: the claim's per-seed file recomputes the verdict's headline
(`python -m marble.experiments.claim_per_seed FILE`), and the verdict names the machines its runs trained on."""

from __future__ import annotations

import json

import pytest

from marble.experiments.claim_cli import machines_section
from tests.test_claim_noise import _write_run


def _claim(tmp_path, machine=None):
    from marble.experiments.claim_cli import main

    runs = tmp_path / "runs"
    for seed, ws in zip((1, 2, 3, 4), (0.5, 0.6, 0.4, 0.5)):
        _write_run(runs, "weighted_sum", seed, ws, ["g", "s"], 6, 0.1 + 0.1 * seed)
        _write_run(runs, "marble_n5", seed, 0.0, ["g", "s"], 6, 0.6)
    if machine is not None:  # the runs' train_summary.json as training writes it now
        for summary in runs.glob("*/train_summary.json"):
            summary.write_text(json.dumps({"cpu_time_s": 10.0, "machine": machine}))
    out = tmp_path / "out"
    assert main(["--runs", str(runs), "--marble-arm", "marble_n5", "--baseline-arm", "weighted_sum",
                 "--out", str(out)]) == 0
    return out


def test_the_headline_recomputes_from_the_per_seed_file(tmp_path, capsys):
    from marble.experiments.claim_per_seed import main as report_main

    out = _claim(tmp_path)
    verdict = json.loads((out / "verdict.json").read_text())
    capsys.readouterr()
    assert report_main([str(out / "per_seed.json")]) == 0
    head = json.loads(capsys.readouterr().out)
    assert head["questions"] == verdict["questions"]  # every answer, interval and Holm p
    # the sections beside the questions too (issue 47: every figure of docs/claim.md)
    for key in ("levels", "noise", "arms_versus_baseline"):
        assert head[key] == verdict[key], key
    assert head["arms_versus_baseline"]["marble_n5"]["a_every_reward_rises"] == \
        verdict["arms_versus_baseline"]["marble_n5"]["a_every_reward_rises"]
    assert head["replication"] == verdict["replication"]["status"]
    assert head["seeds"] == [1, 2, 3, 4] and head["arms"] == verdict["arms"]
    # (c): 0.5 / 0.6 / 0.4 / 0.5 anti-aligned against 0 on every seed
    assert head["questions"]["c_marble_less_anti_aligned"]["difference"]["mean"] == pytest.approx(0.5)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "other"}))
    assert report_main([str(bad)]) == 2


def test_the_verdict_records_the_machine(tmp_path):
    out = _claim(tmp_path, {"cpu_model": "AMD EPYC 7B13", "cpu_capability": "AVX2"})
    v = json.loads((out / "verdict.json").read_text())
    assert v["machine"] == {"machines": [{"cpu_model": "AMD EPYC 7B13", "cpu_capability": "AVX2", "runs": 8}],
                            "one_machine": True, "runs_without_machine": []}


def test_machines_section_counts_each_machine_and_names_runs_without_one():
    xeon = {"cpu_model": "Intel Xeon", "cpu_capability": "AVX512"}
    epyc = {"cpu_model": "AMD EPYC", "cpu_capability": "AVX2"}
    got = machines_section({"a-s1": xeon, "a-s2": epyc, "b-s1": xeon, "b-s2": None})
    assert got["machines"] == [{**xeon, "runs": 2}, {**epyc, "runs": 1}]
    assert got["one_machine"] is False and got["runs_without_machine"] == ["b-s2"]


def test_cpu_model_reads_the_first_model_name_line():
    from marble.runtime.machine import cpu_model, machine

    text = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\nmodel name\t: other\n"
    assert cpu_model(text) == "AMD EPYC 7B13" and cpu_model("processor : 0\n") is None
    assert set(machine()) == {"cpu_model", "cpu_capability"}


def test_a_null_effect_of_interest_in_the_file_reads_back_as_nan():
    """The pilot fixes no effect for a specialist without an alone arm (NaN, null in the file):
    the recomputation reads it back as NaN instead of failing on None."""
    import math

    from marble.experiments.claim_per_seed import headline, per_seed_record
    from marble.report.run_measures import ANGLES, FLAGS, RunMeasure

    anti = {k: 0.0 for k in [*FLAGS, "full_solve", "amortized"]}
    ms = [RunMeasure(a, s, {"g": 0.1 * s, "s": 0.01 * s}, anti, {x: math.nan for x in ANGLES}, math.nan, 0, 4)
          for a in ("weighted_sum", "marble") for s in (1, 2, 3, 4)]
    record = json.loads(json.dumps(per_seed_record(ms, ["g", "s"], {"s": 0.3}, marble_arm="marble",
                                                   baseline_arm="weighted_sum", effect_fraction=0.5,
                                                   fixed_effects={"s": math.nan})))
    assert record["fixed_effects"] == {"s": None}
    b = headline(record)["questions"]["b_specialists_rise_more_under_marble"]["per_specialist"]["s"]
    assert b["effect_of_interest"] is None and b["powered"] is False


def test_the_headline_table_renders_every_question_and_section(tmp_path, capsys):
    """`--markdown`: the table docs/claim.md quotes, one row per question, per arm beside the
    baseline and its `versus`, the halves last; figures as the recomputation gives them."""
    from marble.experiments.claim_markdown import headline_markdown
    from marble.experiments.claim_per_seed import main as report_main

    out = _claim(tmp_path)
    capsys.readouterr()
    assert report_main([str(out / "per_seed.json"), "--markdown"]) == 0
    text = capsys.readouterr().out
    head = json.loads((out / "verdict.json").read_text())
    c = head["questions"]["c_marble_less_anti_aligned"]
    assert text.startswith(f"Seeds 1, 2, 3, 4; arms {', '.join(head['arms'])}.")
    row = [ln for ln in text.splitlines() if ln.startswith("| (c)")][0]
    assert f"{c['difference']['mean']:+.4g} [{c['difference']['low']:+.4g}, {c['difference']['high']:+.4g}]" in row
    assert any(ln.startswith("| `marble_n5` minus `weighted_sum`, each reward") for ln in text.splitlines())
    assert text.strip().splitlines()[-1].startswith("| the seed halves |")
    assert headline_markdown(json.loads(json.dumps({**head, "replication": "replicated",
                                                    "replication_questions": {}}))).count("\n| ") >= 6


def test_side_by_side_sets_two_runs_answers_beside_each_other_and_flags_a_change(tmp_path):
    """The table docs/claim.md compares machines with: one row per question or section, each
    run's answer, and "same" yes only when every run answers alike."""
    import copy

    from marble.experiments.claim_markdown import headline_rows, side_by_side_markdown
    from marble.experiments.claim_per_seed import headline

    head = headline(json.loads((_claim(tmp_path) / "per_seed.json").read_text()))
    other = copy.deepcopy(head)
    other["questions"]["c_marble_less_anti_aligned"]["answer"] = True  # A: not shown (Holm)
    text = side_by_side_markdown({"A": head, "B": other})
    lines = text.splitlines()
    assert lines[0] == "| question | A | B | same |"
    assert len(lines) == 2 + len(headline_rows(head))
    c_row = next(ln for ln in lines if ln.startswith("| (c)"))
    assert c_row.endswith("| not shown | **true** | **no** |")
    assert next(ln for ln in lines if ln.startswith("| the rewards conflict")).endswith("| yes |")
