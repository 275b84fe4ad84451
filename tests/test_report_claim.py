"""`marble report`'s claim questions with known answers (marble.report.demo_claim): the
claim experiment's statistics over seeds on synthetic run folders with eval.jsonl; the
training-reward fallback, named; runs sharing a seed are one sample; the step-kind split."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from test_report import DOWN, MARBLE_DIAG, UP, WS_DIAG, write_run

from marble.report.build import run_trends
from marble.report.run_measures import RunMeasure
from marble.report.cli import main
from marble.report.demo_claim import (HELD_OUT, TRAINING, Runs, by_balancer, demo_verdict, per_seed,
                                      step_kind_text, step_kinds)
from marble.report.loading import load_runs

SEEDS = (1, 2, 3)
SPECIALISTS = {"color": 1 / 3}


def write_seeds(runs, color_gain: dict[int, float], ws_eval: bool = True) -> None:
    """Per seed a weighted-sum and a MARBLE run of one initial model (same step-0 held-out
    means); MARBLE's held-out `color` rises by `color_gain[seed]` more than the weighted
    sum's, whose training curves say the opposite (MARBLE's color falls in training)."""
    for seed in SEEDS:
        start = {"bright": 0.1 * seed, "sat": 0.2, "color": 0.3 + 0.01 * seed}
        ws = {r: (v, v + 0.1 + 0.01 * seed) for r, v in start.items()}
        mb = {**ws, "color": (start["color"], ws["color"][1] + color_gain[seed])}
        write_run(runs, f"ws_s{seed}", "weighted_sum", {"bright": UP, "sat": UP, "color": UP},
                  diag=WS_DIAG, seed=seed, evals=ws if ws_eval or seed != 2 else None)
        write_run(runs, f"marble_s{seed}", "marble", {"bright": UP, "sat": UP, "color": DOWN},
                  diag=MARBLE_DIAG, seed=seed, evals=mb)


def verdict_of(runs) -> dict:
    loaded = load_runs(runs)
    return demo_verdict(loaded, run_trends(loaded, 2, 0.0), SPECIALISTS)


def test_specialist_rising_more_on_every_seed_is_true(tmp_path):
    """Through `marble report`: paired differences 0.18, 0.20, 0.22 (mean 0.2, sd 0.02,
    t(0.975, 2) = 4.3027: 0.2 +- 0.0497) -> True; the training curves alone say the reverse."""
    runs = tmp_path / "runs"
    write_seeds(runs, {1: 0.18, 2: 0.20, 3: 0.22})
    assert main(["--runs", str(runs), "--out", str(tmp_path / "report"), "--window", "2"]) == 0
    v = json.loads((tmp_path / "report" / "verdict.json").read_text())
    assert v["specialists_rise_more_under_marble"] is True
    assert v["specialist_rises_more_under_marble"] == {"color": True}
    diff = v["questions"]["b_specialists_rise_more_under_marble"]["per_specialist"]["color"]["difference"]
    assert diff["mean"] == pytest.approx(0.2) and diff["n"] == 3 and diff["sd"] == pytest.approx(0.02)
    assert diff["low"] == pytest.approx(0.2 - 4.302653 * 0.02 / math.sqrt(3), abs=1e-6)
    q_b = v["questions"]["b_specialists_rise_more_under_marble"]
    assert q_b["measure"] == HELD_OUT and q_b["paired_seeds"] == [1, 2, 3]
    # (a): every held-out change is > 0 on every seed (bright +0.11..+0.13 etc.)
    assert v["every_reward_rises_under_marble"] is True
    assert v["questions"]["a_every_reward_rises_under_marble"]["seeds"] == [1, 2, 3]
    # (c): the weighted sum opposes a reward on half its 4 diagnostic steps, MARBLE on none,
    # every seed: the paired sd is 0, but 4 steps are a coarse fraction. Sampling-error floor
    # (Jeffreys): se(2/4) = sqrt(.5 x .5 / 4) = 0.25, se(0/4) = sqrt(.1 x .9 / 4) = 0.15,
    # hypot 0.29155; 0.5 +- 4.302653 x 0.29155 / sqrt 3 = 0.5 +- 0.72426 -> a bound, not true;
    # its high end 1.22 is cut to 1, the most a difference of two fractions can be.
    assert v["marble_less_anti_aligned"] == "no difference larger than 1"
    md = (tmp_path / "report" / "report.md").read_text()
    assert ("(b) Every specialist rises more under MARBLE than under the weighted sum (paired by seed): "
            "true. MARBLE minus weighted sum, the held-out change (eval.jsonl: last evaluation minus "
            "step 0), paired over the seeds both balancers ran (1, 2, 3): color +0.2 [+0.15, +0.25] (true, "
            "minimal detectable difference ") in md
    assert "held-out" in (tmp_path / "report" / "tables" / "reward_change_by_balancer.csv").read_text()


def test_within_noise_is_no_difference_larger_than_the_interval_bound(tmp_path):
    """Differences +0.01, -0.02, +0.04: mean 0.01, sd 0.03, half width 4.302653 x 0.03 /
    sqrt 3 = 0.074524, interval [-0.0645, +0.0845]: "no difference larger than 0.0845"."""
    write_seeds(tmp_path, {1: 0.01, 2: -0.02, 3: 0.04})
    v = verdict_of(tmp_path)
    assert v["specialists_rise_more_under_marble"] == "no difference larger than 0.0845"
    p = v["questions"]["b_specialists_rise_more_under_marble"]["per_specialist"]["color"]
    assert p["difference"]["high"] == pytest.approx(0.01 + 0.0745242, abs=1e-6)
    # (t(0.975, 2) + t(0.8, 2)) x 0.03 / sqrt 3 = (4.302653 + 1.060660) x 0.017321 = 0.092895
    assert p["minimal_detectable_difference"] == pytest.approx(0.092895, abs=1e-5)
    assert "minimal detectable difference 0.0929" in v["sentences"][1]


def test_a_run_without_eval_jsonl_puts_its_question_on_training_rewards_and_says_so(tmp_path):
    """ws_s2 has no eval.jsonl: (b) measures every run by its training reward (never a mix),
    where MARBLE's color fell (DOWN) and the weighted sum's rose (UP) on every seed: False;
    (a) uses MARBLE's runs alone, all evaluated: held-out."""
    write_seeds(tmp_path, {1: 0.18, 2: 0.20, 3: 0.22}, ws_eval=False)
    v = verdict_of(tmp_path)
    q = v["questions"]
    assert q["b_specialists_rise_more_under_marble"]["measure"] == TRAINING
    assert v["specialists_rise_more_under_marble"] is False  # -0.6 on every seed, sd 0
    assert "training-reward change (last logged epochs minus the first; no eval.jsonl in ws_s2)" \
        in v["sentences"][1]
    assert q["a_every_reward_rises_under_marble"]["measure"] == HELD_OUT
    assert v["reward_change_by_balancer"]["weighted_sum"]["measure"] == TRAINING
    assert v["reward_change_by_balancer"]["marble"]["measure"] == HELD_OUT
    assert "ws_s2" not in v["heldout_change"] and "ws_s1" in v["heldout_change"]


def test_runs_of_one_balancer_and_seed_are_one_sample(tmp_path):
    write_run(tmp_path, "marble", "marble", {"bright": UP, "sat": UP, "color": UP}, seed=7,
              evals={"bright": (0.0, 0.2), "sat": (0.0, 0.2), "color": (0.0, 0.2)})
    write_run(tmp_path, "rho_05", "marble", {"bright": UP, "sat": UP, "color": UP}, seed=7, rho=0.5,
              evals={"bright": (0.0, 0.4), "sat": (0.0, 0.2), "color": (0.0, math.nan)})
    write_run(tmp_path, "other", "marble", {"bright": UP, "sat": UP, "color": UP}, seed=8,
              evals={"bright": (0.0, 0.1), "sat": (0.0, 0.2), "color": (0.0, 0.2)})
    write_run(tmp_path, "legacy", "marble", {"bright": UP, "sat": UP, "color": UP})
    (tmp_path / "legacy" / "config.yaml").write_text("balancer: {method: marble}\n")  # no train.seed
    v = verdict_of(tmp_path)
    change = v["reward_change_by_balancer"]["marble"]
    assert change["seeds"] == [7, 8]
    assert change["change"]["bright"]["n"] == 2
    assert change["change"]["bright"]["mean"] == pytest.approx(((0.2 + 0.4) / 2 + 0.1) / 2)
    assert change["change"]["color"]["mean"] == pytest.approx(0.2)  # NaN left out, not a zero
    assert v["runs_without_seed"] == ["legacy"]
    assert "Left out of the questions (no `train.seed` in config.yaml): legacy." in v["sentences"]
    assert v["every_reward_rises_under_marble"].startswith("no difference larger than ")


def test_per_seed_averages_and_keeps_the_worst_full_solve_cosine():
    a = RunMeasure("m", 1, {"r": 1.0}, {"applied": 0.0}, {"x": 10.0}, 0.2, 3)
    b = RunMeasure("m", 1, {"r": math.nan}, {"applied": 0.5}, {"x": 20.0}, -0.1, 2)
    c = RunMeasure("m", 2, {"r": 4.0}, {"applied": 1.0}, {"x": 0.0}, math.nan, 0)
    merged = per_seed([a, b, c])
    assert merged[0] == RunMeasure("m", 1, {"r": 1.0}, {"applied": 0.25}, {"x": 15.0}, -0.1, 5)
    assert merged[1] is c


def test_anti_aligned_split_into_full_solve_and_amortized_steps(tmp_path):
    """A MARBLE run's anti-aligned steps by whether the diagnostic micro-batch solved:
    full_solve > 0 (a fresh alpha) vs 0 (the cached EMA alpha); no split without solves."""
    from marble.report.tables import _by_step_kind

    marble = pd.DataFrame({"cos_min": [0.3, -0.2, -0.1, 0.2, 0.1, np.nan],
                           "anti_aligned": [0, 1, 1, 0, 0, np.nan],
                           "full_solve": [1.0, 0.0, 0.0, 0.125, 0.0, 0.0]})
    split = _by_step_kind(marble)
    assert split == {"solve_steps": 2, "applied_anti_aligned_frac_solve": 0.0,
                     "applied_anti_aligned_frac_amortized": pytest.approx(2 / 3)}
    ws = pd.DataFrame({"cos_min": [-0.3, 0.2], "anti_aligned": [1, 0], "full_solve": [0.0, 0.0]})
    assert _by_step_kind(ws)["solve_steps"] == 0
    # the verdict's split: the same fractions, as intervals over seeds
    for seed, solved in ((1, [1.0, 0, 0, 0.125]), (2, [1.0, 0, 0, 0])):
        write_run(tmp_path, f"m{seed}", "marble", {"bright": UP, "sat": UP, "color": UP}, seed=seed,
                  diag={"cos_min": [0.3, -0.2, -0.1, 0.2], "anti_aligned": [0, 1, 1, 0], "full_solve": solved})
    loaded = load_runs(tmp_path)
    kinds = step_kinds(by_balancer(Runs(loaded, run_trends(loaded, 2, 0.0))))
    assert kinds["marble"]["solve_steps"] == 3
    assert kinds["marble"]["full_solve"]["mean"] == 0.0
    assert kinds["marble"]["amortized"]["mean"] == pytest.approx((2 / 2 + 2 / 3) / 2)
    text = step_kind_text(kinds)
    # 0% of 1 and of 2 solves: each run's Jeffreys error (0.433, 0.264) floors the seeds' sd
    # of 0, so two seeds give [0%, 100%], not the zero-width [0%, 0%]
    assert "marble: full-solve steps 0% [0%, 100%] (3 steps), amortized steps 83% [" in text
    assert step_kind_text({}) == ""


def test_the_training_curves_show_the_heldout_evaluation(tmp_path):
    import matplotlib.pyplot as plt

    from marble.report.figures import _heldout_curve

    write_run(tmp_path, "m", "marble", {"bright": UP, "sat": UP, "color": UP}, seed=1,
              evals={"bright": (0.1, 0.3), "sat": (0.0, 0.2), "color": (0.0, 0.2)})
    write_run(tmp_path, "w", "weighted_sum", {"bright": UP, "sat": UP, "color": UP}, seed=1)
    evaluated, plain = load_runs(tmp_path)
    fig, ax = plt.subplots()
    _heldout_curve(ax, evaluated, "bright", "k")
    _heldout_curve(ax, plain, "bright", "k")
    (line,) = ax.lines
    assert line.get_label() == "_m held-out"  # "_": not a legend entry (one legend per figure)
    assert list(line.get_xdata()) == [0, 4, 8] and list(line.get_ydata()) == pytest.approx([0.1, 0.2, 0.3])
    plt.close(fig)
