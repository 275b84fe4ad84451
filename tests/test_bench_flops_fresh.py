"""`marble bench flops` rows of issue 37's options: a fresh balance at the weighted sum's cost."""

from __future__ import annotations

import pytest

from marble.config import load_config


def test_output_gram_and_norm_corrected_rows_cost_the_weighted_sum(capsys):
    """Done-when of issue 37: both rows <= 1.01x the weighted sum's counted FLOPs, with its
    passes (one forward with grad, one backward: no per-reward transformer pass)."""
    from marble.tools.bench import main

    assert main(["flops", "--preset", "tiny", "--rows",
                 "weighted_sum,marble,marble_output_gram,marble_norm_corrected"]) == 0
    lines = {line.split("|")[1].strip(): line.split("|") for line in capsys.readouterr().out.splitlines()
             if line.startswith("| marble_") or line.startswith("| weighted_sum")}
    for row in ("marble_output_gram", "marble_norm_corrected"):
        cells = lines[row]
        assert float(cells[3]) <= 1.01, row  # x weighted_sum
        assert (cells[4].strip(), cells[6].strip()) == ("1", "1"), row  # fwd grad, backward


def test_runs_of_the_options_are_priced_from_their_rows():
    from marble.balancers.cadence import kind_row, run_overhead

    flops = {"weighted_sum": 1.0, "marble": 1.0, "marble_diag": 3.0, "mgda": 5.0, "mgda_diag": 6.0,
             "marble_output_gram": 1.5, "marble_norm_corrected": 2.0}
    out = run_overhead(load_config("tiny_output_gram"), flops)
    assert out["full_solves"] == 0  # no solve of per-reward parameter gradients, ever
    n, diag = out["micro_steps"], out["diagnostic_micro_steps"]
    assert out["ratio"] == pytest.approx(((n - diag) * 1.5 + diag * 3.0) / n)
    # tiny reads cosines on every micro-step (diagnostics_every 1, diagnostics_micro all): a run
    # with plain amortized micro-steps between its diagnostic steps prices them from their row
    sparse = ["balancer.diagnostics_every=4"]
    base = run_overhead(load_config("tiny", overrides=sparse), flops)
    normcorr = run_overhead(load_config("tiny_norm_corrected", overrides=sparse), flops)
    assert normcorr["full_solves"] == base["full_solves"] > 0  # MARBLE's schedule, unchanged
    assert normcorr["ratio"] > base["ratio"]  # its amortized steps read their own row
    assert kind_row("marble", "retain", True, False, None, "marble_norm_corrected") == "mgda"
    with pytest.raises(KeyError, match="marble_output_gram"):
        run_overhead(load_config("tiny_output_gram", overrides=sparse), {"weighted_sum": 1.0, "marble_diag": 1.0})


def test_every_claim_and_zoo_arm_is_priced_with_the_rows_its_cadence_names(tmp_path):
    """The cost rules ask `claim_cost --print-rows` which bench rows to count: every arm of
    config.yaml's claim and zoo, as run and without diagnostics (`plain`, the cost a user pays
    for the balancer), is priced from exactly those rows. The claim rule's fixed row list had
    no `marble_output_gram`: pricing the output-space arm without diagnostics failed after
    every training had run."""
    import json
    from pathlib import Path

    import yaml

    from marble.experiments import claim_cost
    from marble.workflow import claim as wf_claim

    from marble.workflow import configs

    root = Path(__file__).resolve().parents[1]
    cfg = yaml.safe_load((root / "config.yaml").read_text())
    # the claim's overlays (each composed over config.yaml) add arms the default lacks
    full = configs.load(["config/claim_full.yaml"], root)["claim"]
    curve = configs.load(["config/claim_n_curve.yaml"], root)["claim"]
    for section in (cfg["claim"], full, curve, wf_claim.zoo_section(cfg)):
        arms = wf_claim.arms(section)
        assert claim_cost.main(["--print-rows", "--arms", json.dumps(arms), "--model", "unused"]) == 0
        rows = claim_cost.arm_rows(arms, "unused")
        flops = {row: 1.0 + i for i, row in enumerate(rows)}
        costs = claim_cost.arm_costs(arms, flops, "unused")
        assert set(costs) == set(arms)
        for arm, cost in costs.items():
            assert cost["plain"]["diagnostic_micro_steps"] == 0, arm
            assert cost["plain"]["micro_steps"] == cost["micro_steps"], arm
    assert {"marble_output_gram", "marble_norm_corrected"} <= set(claim_cost.arm_rows(wf_claim.arms(full), "x"))
    # issue 47: every reported arm is priced (the sweep's, the control's), and a sweep arm's
    # 24-sample micro-step counts as 4 bench micro-steps of 6: 30 steps x 1 x 2 timesteps = 60
    # micro-steps x 4 = 240 FLOPs at 1.0 a row, the 6-sample arm's 30 x 4 x 2 = 240 (same samples)
    priced = wf_claim.priced_arms(cfg["claim"])
    assert set(priced) >= {"weighted_sum_mb24", "control_weighted_sum"}
    pair = {a: priced[a] for a in ("weighted_sum", "weighted_sum_mb24")}
    cost = claim_cost.arm_costs(pair, {"weighted_sum": 1.0, "weighted_sum_diag": 1.0}, "unused")
    assert cost["weighted_sum_mb24"]["micro_steps"] == 60 and cost["weighted_sum"]["micro_steps"] == 240
    assert cost["weighted_sum_mb24"]["plain"]["flops"] == pytest.approx(cost["weighted_sum"]["plain"]["flops"])
    assert cost["weighted_sum_mb24"]["micro_batch"] == 24 and cost["weighted_sum_mb24"]["ratio"] == 1.0
    # a pricing row missing from the bench is named, never priced as another row
    with pytest.raises(KeyError, match="marble_output_gram"):
        claim_cost.arm_costs({"o": {"preset": "tiny_output_gram", "set": [], "max_steps": 2}},
                             {"weighted_sum": 1.0, "marble_diag": 1.0}, "unused")
