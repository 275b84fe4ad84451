"""`marble bench flops`: counted FLOPs, passes and live-tensor peak on meta tensors.

Deterministic, so the cost claims are asserted: an amortized MARBLE micro-step costs
exactly the weighted sum's FLOPs and passes (one grad forward, one backward, plus the two
no-grad forwards every balancer runs), with <= 2% more live memory; over a 1,000-step
rho_07 run the full solves and diagnostics add <= 0.2%. Full SD3.5M depth (24 layers)
takes minutes on a CPU: the test counts SD3.5M widths, batch, resolution, rank and K at
depth 1 (`--layers 1`); the full-size table is the documented `marble bench flops
--preset bench_sd35m` run.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
from extras import needs

from marble.config import load_config

PRICED = ("weighted_sum", "marble", "marble_diag", "mgda", "mgda_diag")  # rho_07's kinds


ZOO = ("zoo_upgrad", "zoo_upgrad_full")  # a weighting off the simplex, amortized and full
HAS_ZOO = importlib.util.find_spec("torchjd") is not None


@pytest.fixture(scope="module")
def mid():
    from marble.tools.bench_flops import bench_flops

    return bench_flops(load_config("bench_sd35m", overrides=["model.mixed_precision=fp16"]),
                       rows=PRICED + (ZOO if HAS_ZOO else ()), runs=("rho_07", "full_mgda"),
                       num_layers=1)


@pytest.mark.skipif(not HAS_ZOO, reason="the zoo extra (torchjd) is not installed")
def test_zoo_rows_count_on_a_preset_that_fills_masked_rewards(mid):
    """bench_sd35m keeps the reference's r = 1/2 fill (exact_masking false), which a weighting
    off the simplex refuses (it raised ConfigError here): the zoo's rows count with exact
    masking, as every zoo preset trains, at the same FLOPs."""
    rows = mid["rows"]
    assert rows["zoo_upgrad"]["flops"] == rows["weighted_sum"]["flops"]
    assert rows["zoo_upgrad_full"]["flops"] > 1.5 * rows["weighted_sum"]["flops"]


def test_amortized_marble_costs_the_weighted_sum(mid):
    ws, marble = mid["rows"]["weighted_sum"], mid["rows"]["marble"]
    assert marble["flops"] == ws["flops"] > 1e12  # exactly, not approximately
    passes = {"forward_grad": 1, "forward_no_grad": 2, "backward": 1}
    assert {k: ws[k] for k in passes} == passes == {k: marble[k] for k in passes}
    assert marble["peak_live_gib"] <= 1.02 * ws["peak_live_gib"]
    assert mid["lora_params"] > 0 and mid["num_rewards"] == 5 and mid["batch_size"] == 9


def test_full_solve_passes_and_rho_07_whole_run_overhead(mid):
    k = mid["num_rewards"]
    mgda, diag = mid["rows"]["mgda"], mid["rows"]["mgda_diag"]
    assert (mgda["forward_grad"], mgda["backward"]) == (1, k + 1)  # K rewards + KL, retained
    assert diag["backward"] == k + 2  # + the weighted-sum direction on the cadence
    assert mgda["flops"] > 1.5 * mid["rows"]["weighted_sum"]["flops"]
    rho = mid["runs"]["rho_07"]
    # step 0 (warm-up) solves on all 192 micro-steps, then steps 10, 20, ..., 990
    assert rho["micro_steps"] == 1000 * 192 and rho["full_solves"] == 192 + 99
    # At depth 1: +0.14%. NB at full depth (`marble bench flops --preset bench_sd35m`,
    # 24 layers) the same cadence gives +0.230%: the warm-up step's 192 full solves alone are
    # +0.14% (warmup_steps = 1 solves every micro-step of step 0), the 99 later ones +0.07%.
    assert 0 < rho["overhead"] <= 0.002
    assert mid["runs"]["full_mgda"]["full_solves"] == 192000
    assert mid["runs"]["full_mgda"]["ratio"] == pytest.approx(
        mgda["flops"] / mid["rows"]["weighted_sum"]["flops"], rel=1e-3)


def test_cadence_by_hand():
    from marble.balancers.cadence import micro_step_kinds, run_overhead

    cfg = load_config("rho_07", overrides=["train.max_steps=21"])
    kinds = micro_step_kinds(cfg)
    # 192 micro-steps a step; warm-up step 0 solves all of them, steps 10 and 20 solve the
    # first; diagnostics (every 10th step, first micro-step) on steps 0, 10, 20.
    assert kinds == {(True, True): 3, (True, False): 191, (False, False): 21 * 192 - 194}
    flops = {"weighted_sum": 1.0, "marble": 1.0, "mgda": 3.0, "mgda_diag": 4.0}
    out = run_overhead(cfg, flops)
    expected = (3 * 4.0 + 191 * 3.0 + (21 * 192 - 194) * 1.0) / (21 * 192)
    assert out["ratio"] == pytest.approx(expected) and out["full_solves"] == 194
    with pytest.raises(KeyError, match="needs rows"):
        run_overhead(cfg, {"weighted_sum": 1.0})
    # diagnostics_micro=all (issue 36's three levels): every micro-step of steps 0, 10, 20
    every = load_config("rho_07", overrides=["train.max_steps=21", "balancer.diagnostics_micro=all"])
    plain = 21 * 192 - 194 - 2 * 191
    assert micro_step_kinds(every) == {(True, True): 194, (False, True): 2 * 191, (False, False): plain}
    out = run_overhead(every, {**flops, "marble_diag": 2.5})
    assert out["ratio"] == pytest.approx((194 * 4.0 + 382 * 2.5 + plain * 1.0) / (21 * 192))


def test_cli_tiny_json_and_markdown(tmp_path, capsys):
    from marble.tools.bench import main

    out, md = tmp_path / "flops.json", tmp_path / "flops.md"
    assert main(["flops", "--preset", "tiny", "--json", str(out), "--md", str(md),
                 "--rows", "weighted_sum,marble", "--runs", "tiny"]) == 0
    res = json.loads(out.read_text())
    assert res["rows"]["marble"]["flops"] == res["rows"]["weighted_sum"]["flops"] > 0
    assert res["runs"] == {} and "needs rows" in res["runs_unpriced"]["tiny"]
    assert md.read_text() == capsys.readouterr().out and "| marble |" in md.read_text()



def test_zoo_rows_amortize_at_the_weighted_sums_flops_exactly():
    """The balancer zoo's rows on the tiny preset: amortized = weighted_sum FLOPs exactly,
    the full-solve row (listed above its amortized row) K + 1 backward passes."""
    needs("torchjd", "zoo")
    from marble.tools.bench_flops import bench_flops

    rows = ("weighted_sum", "zoo_pcgrad_full", "zoo_pcgrad", "gdpo")  # one per code path
    res = bench_flops(load_config("tiny"), rows=rows, runs=())
    r, k = res["rows"], res["num_rewards"]
    for row in ("zoo_pcgrad", "gdpo"):
        assert r[row]["flops_ratio"] == 1.0 and r[row]["backward"] == 1, row
    assert r["zoo_pcgrad_full"]["backward"] == k + 1 and r["zoo_pcgrad_full"]["flops_ratio"] > 1
    assert list(r).index("zoo_pcgrad_full") < list(r).index("zoo_pcgrad")


def test_zoo_runs_are_priced_from_their_own_rows():
    """A tiny_zoo run has MARBLE's tiny cadence, each kind of micro-step priced from the
    weighting's rows (diagnostic ones from MARBLE's); gdpo runs the weighted sum's."""
    needs("torchjd", "zoo")
    from marble.balancers.cadence import run_overhead

    flops = {"weighted_sum": 1.0, "weighted_sum_diag": 2.0, "marble": 1.0, "marble_diag": 3.0,
             "mgda": 5.0, "mgda_diag": 6.0, "zoo_pcgrad": 1.0, "zoo_pcgrad_full": 5.0,
             "gdpo": 1.0}
    # every other step without diagnostics: tiny measures every micro-step of a diagnostic
    # step (issue 36), so at diagnostics_every=1 no micro-step would read the zoo's own rows
    every = ["balancer.diagnostics_every=2"]
    zoo, tiny = run_overhead(load_config("tiny_zoo_pcgrad", overrides=every), flops), run_overhead(
        load_config("tiny", overrides=every), flops)
    assert zoo["full_solves"] == tiny["full_solves"] > 0 and zoo["ratio"] == tiny["ratio"]
    flops["zoo_pcgrad_full"] = 50.0  # its full solves are read from its own row
    assert run_overhead(load_config("tiny_zoo_pcgrad", overrides=every), flops)["ratio"] > tiny["ratio"]
    gdpo = run_overhead(load_config("tiny_gdpo"), flops)
    assert gdpo["ratio"] == run_overhead(load_config("tiny_weighted_sum"), flops)["ratio"]
