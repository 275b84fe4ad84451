"""The claim's logic on synthetic metrics with known answers: a specialist that rises
beyond noise, within noise, or falls; pooled seeds; verdict.json's shape."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from marble.report.claim import (
    INCONCLUSIVE,
    Change,
    balancer_changes,
    claim_lines,
    difference,
    every_reward_rises,
    pooled_change,
    sign_beyond,
    specialists_rise_more,
)
from marble.report.verdict import RunTrend, reward_changes


def test_pooled_change_hand_calculation():
    # Between runs: mean 2, std 1.4142 -> se 1.0; within: sqrt((0.1^2+0.1^2)/2/2) = 0.0707.
    c = pooled_change([1.0, 3.0], [0.1, 0.1])
    assert c.mean == pytest.approx(2.0) and c.se == pytest.approx(1.0) and c.runs == 2
    # Two seeds that agree by chance: the within-run noise is the floor.
    c = pooled_change([1.0, 1.0], [0.4, 0.2])
    assert c.se == pytest.approx(math.sqrt((0.16 + 0.04) / 2 / 2))
    # NaN runs are left out, not read as zero; nothing finite -> NaN.
    assert pooled_change([1.0, math.nan], [0.5, 0.1]) == Change(1.0, 0.5, 1)
    assert math.isnan(pooled_change([math.nan], [math.nan]).mean)


def test_sign_beyond_and_all_of():
    assert sign_beyond(0.5, 0.2) is True
    assert sign_beyond(-0.5, 0.2) is False
    assert sign_beyond(0.3, 0.2) == INCONCLUSIVE
    assert sign_beyond(0.3, math.nan) == INCONCLUSIVE  # no error bar: not a claim
    assert every_reward_rises({"a": Change(1, 0.1, 2), "b": Change(1, 0.1, 2)}) is True
    assert every_reward_rises({"a": Change(1, 0.1, 2), "b": Change(0.1, 0.1, 2)}) == INCONCLUSIVE
    assert every_reward_rises({"a": Change(1, 0.1, 2), "b": Change(-1, 0.1, 2)}) is False
    assert difference(Change(1.0, 0.3, 2), Change(0.5, 0.4, 3)) == Change(0.5, 0.5, 2)


def _metrics(curve: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"step": np.arange(len(curve)), "reward/spec": curve,
                         "reward/gen": np.linspace(0.0, 1.0, len(curve))})


def _trend(run, balancer, slope, seed):
    """A run whose specialist rises by `slope` over 20 epochs, plus epoch noise (sd 0.01)."""
    rng = np.random.default_rng(seed)
    curve = np.linspace(0.0, slope, 20) + rng.normal(0.0, 0.01, 20)
    return RunTrend(run, balancer, reward_changes(_metrics(curve), ["spec", "gen"], window=5))


@pytest.mark.parametrize("marble_slope, ws_slope, expected", [
    (0.5, 0.0, True),            # specialist up under MARBLE beyond noise, flat under WS
    (0.005, 0.0, INCONCLUSIVE),  # a difference within noise
    (-0.5, 0.0, False),          # specialist down under MARBLE: WS rises more
])
def test_specialists_rise_more_known_answers(marble_slope, ws_slope, expected):
    trends = [_trend(f"marble_s{s}", "marble", marble_slope, s) for s in (1, 2)]
    trends += [_trend(f"ws_s{s}", "weighted_sum", ws_slope, 10 + s) for s in (1, 2)]
    by = balancer_changes(trends)
    assert by["marble"]["spec"].runs == 2
    assert by["marble"]["spec"].mean == pytest.approx(marble_slope * 15 / 19, abs=0.02)
    assert specialists_rise_more(by["marble"], by["weighted_sum"], ["spec"]) == expected
    answers, lines = claim_lines(by, ["spec"], {"weighted_sum": 0.75, "marble": 0.1})
    assert answers["specialists_rise_more_under_marble"] == expected
    assert answers["specialist_rises_more_under_marble"] == {"spec": expected}
    assert answers["every_reward_rises_under_marble"] == (
        True if expected is True else (False if expected is False else INCONCLUSIVE))
    assert "weighted_sum 75%" in lines[2] and "weighted sum 80%, MARBLE 0%" in lines[2]


def test_one_specialist_beyond_noise_and_one_within_is_inconclusive_overall():
    marble = {"ocr": Change(0.5, 0.1, 2), "gen": Change(0.02, 0.1, 2)}
    ws = {"ocr": Change(-0.1, 0.1, 2), "gen": Change(0.0, 0.1, 2)}
    assert specialists_rise_more(marble, ws, ["ocr", "gen"]) == INCONCLUSIVE
    answers, lines = claim_lines({"marble": marble, "weighted_sum": ws}, ["ocr", "gen"], {})
    assert answers["specialist_rises_more_under_marble"] == {"ocr": True, "gen": INCONCLUSIVE}
    assert "ocr: MARBLE +0.5 ± 0.1 vs weighted sum -0.1 ± 0.1, difference +0.6 ± 0.14 (yes)" in lines[1]


def test_claim_without_runs_or_specialists_is_inconclusive():
    answers, _ = claim_lines({}, ["spec"], {})
    assert answers == {"every_reward_rises_under_marble": INCONCLUSIVE,
                       "specialists_rise_more_under_marble": INCONCLUSIVE}
    by = {"marble": {"gen": Change(1, 0.1, 2)}, "weighted_sum": {"gen": Change(1, 0.1, 2)}}
    assert claim_lines(by, [], {})[0]["specialists_rise_more_under_marble"] == INCONCLUSIVE


def test_change_pair_is_json_safe():
    assert json.dumps(Change(math.nan, 0.1, 0).pair()) == "[null, 0.1]"


def test_anti_aligned_split_into_full_solve_and_amortized_steps():
    """A MARBLE run's anti-aligned steps, by whether the diagnostic micro-batch solved:
    full_solve > 0 (a fresh alpha) vs 0 (the cached EMA alpha); no split without solves."""
    from marble.report.claim import _step_kind_text
    from marble.report.tables import _by_step_kind

    marble = pd.DataFrame({"cos_min": [0.3, -0.2, -0.1, 0.2, 0.1, np.nan],
                           "anti_aligned": [0, 1, 1, 0, 0, np.nan],
                           "full_solve": [1.0, 0.0, 0.0, 0.125, 0.0, 0.0]})
    split = _by_step_kind(marble)
    assert split == {"solve_steps": 2, "applied_anti_aligned_frac_solve": 0.0,
                     "applied_anti_aligned_frac_amortized": pytest.approx(2 / 3)}
    ws = pd.DataFrame({"cos_min": [-0.3, 0.2], "anti_aligned": [1, 0], "full_solve": [0.0, 0.0]})
    assert _by_step_kind(ws)["solve_steps"] == 0
    assert math.isnan(_by_step_kind(ws)["applied_anti_aligned_frac_solve"])
    assert math.isnan(_by_step_kind(marble.drop(columns="full_solve"))["applied_anti_aligned_frac_amortized"])
    text = _step_kind_text({"marble": {"full_solve": 0.0, "amortized": 2 / 3, "solve_steps": 2}})
    assert "marble: full-solve steps 0% (2 steps), amortized steps 67%" in text
    assert _step_kind_text({"mgda": {"full_solve": None, "amortized": None, "solve_steps": 0}}) == ""
    _, lines = claim_lines({}, [], {"marble": 0.5}, anti_by_step_kind={
        "marble": {"full_solve": 0.0, "amortized": 2 / 3, "solve_steps": 2}})
    assert "amortized steps 67%" in lines[-1]
