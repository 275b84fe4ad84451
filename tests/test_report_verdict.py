"""The verdict's pure functions against hand calculations, for every outcome."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from marble.report.verdict import (
    RunTrend,
    auto_window,
    reward_changes,
    specialist_rewards,
    verdict,
)

REWARDS = ["bright", "sat", "color"]


def metrics(curves: dict[str, list], applicable: dict[str, int] | None = None) -> pd.DataFrame:
    n = len(next(iter(curves.values())))
    frame = pd.DataFrame({"step": np.arange(1, n + 1)})
    for name, values in curves.items():
        frame[f"reward/{name}"] = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce")
        frame[f"reward_applicable/{name}"] = (applicable or {}).get(name, 24)
    return frame


def trend(run, balancer, curves, window=2, min_gain=0.0):
    return RunTrend(run, balancer, reward_changes(metrics(curves), list(curves), window, min_gain))


def test_reward_changes_hand_calculation():
    frame = metrics({"a": [1, 2, 3, 4, 5, 6, 7, 8], "b": [4, None, float("nan"), 3, 2, 1, 0, 0]})
    changes = reward_changes(frame, ["a", "b"], window=2)
    assert changes["a"].first == pytest.approx(1.5)
    assert changes["a"].last == pytest.approx(7.5)
    assert changes["a"].delta == pytest.approx(6.0)
    assert changes["a"].improved
    # NaN/null epochs are skipped, not read as zero: finite b = [4, 3, 2, 1, 0, 0]
    assert changes["b"].first == pytest.approx(3.5)
    assert changes["b"].last == pytest.approx(0.0)
    assert not changes["b"].improved


def test_reward_changes_auto_window_min_gain_and_unmeasurable():
    assert [auto_window(n) for n in (1, 3, 8, 20, 100)] == [1, 1, 2, 5, 5]
    frame = metrics({"a": [0.0] * 4 + [0.05] * 4, "b": [None] * 7 + [1.0]})
    changes = reward_changes(frame, ["a", "b", "absent"], min_gain=0.1)  # auto window = 2
    assert changes["a"].delta == pytest.approx(0.05)
    assert not changes["a"].improved  # below min_gain
    assert math.isnan(changes["b"].delta) and not changes["b"].improved
    assert math.isnan(changes["absent"].delta)


def test_specialist_detection():
    frame = metrics({"bright": [1, 2], "sat": [1, 2], "color": [1, 2]},
                    {"bright": 24, "sat": 24, "color": 8})
    assert specialist_rewards(frame, REWARDS) == {"color": pytest.approx(1 / 3)}
    same = metrics({"bright": [1, 2], "sat": [1, 2]}, {"bright": 24, "sat": 24})
    assert specialist_rewards(same, ["bright", "sat"]) == {}


UP, DOWN, FLAT = [0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1], [0.3, 0.3, 0.3, 0.3]
SPEC = {"color": 1 / 3}


def run_pair(marble_curves, ws_curves):
    return [trend("marble", "marble", marble_curves), trend("ws", "weighted_sum", ws_curves)]


def test_marble_keeps_all_improving_ws_dilutes_specialist():
    v = verdict(run_pair({"bright": UP, "sat": UP, "color": UP},
                         {"bright": UP, "sat": UP, "color": DOWN}), SPEC)
    assert v.outcomes == {"marble": "marble_keeps_all_ws_dilutes"}
    assert v.text.startswith("Yes: MARBLE (`marble`) kept every reward improving")
    assert "color (33% of rollouts)" in v.text
    assert "color +0.2 under MARBLE vs color -0.2 under the weighted sum" in v.text


def test_both_fine():
    v = verdict(run_pair({"bright": UP, "sat": UP, "color": UP},
                         {"bright": UP, "sat": FLAT, "color": UP}), SPEC)
    assert v.outcomes == {"marble": "both_fine"}
    assert "No dilution seen" in v.text


def test_marble_also_dilutes():
    v = verdict(run_pair({"bright": UP, "sat": UP, "color": FLAT},
                         {"bright": UP, "sat": UP, "color": DOWN}), SPEC)
    assert v.outcomes == {"marble": "marble_also_dilutes"}
    assert "under MARBLE (`marble`) the specialist color did not improve either" in v.text
    assert "color +0" in v.text and "color -0.2" in v.text
    assert "General rewards improving: bright, sat under MARBLE, bright, sat under the weighted sum" in v.text


def test_reverse_and_partial_outcomes():
    v = verdict(run_pair({"bright": UP, "sat": UP, "color": DOWN},
                         {"bright": UP, "sat": UP, "color": UP}), SPEC)
    assert v.outcomes == {"marble": "ws_fine_marble_dilutes"}
    assert "the reverse" in v.text
    v = verdict(run_pair({"bright": DOWN, "sat": UP, "color": UP},
                         {"bright": UP, "sat": UP, "color": DOWN}), SPEC)
    assert v.outcomes == {"marble": "marble_not_all"}
    assert "not improving: bright" in v.text and "diluted it" in v.text


def test_no_specialist_and_incomplete():
    v = verdict(run_pair({"bright": UP, "sat": UP}, {"bright": UP, "sat": DOWN}), {})
    assert v.outcomes == {"marble": "no_specialist"}
    assert "MARBLE (`marble`) kept every reward improving" in v.text
    assert "(`ws`) did not keep" in v.text
    only_marble = verdict([trend("m", "marble", {"bright": UP})], SPEC)
    assert only_marble.outcomes == {"m": "incomplete"}
    assert "needs a weighted-sum run" in only_marble.text


def test_each_marble_run_compared_and_run_lines():
    trends = run_pair({"bright": UP, "sat": UP, "color": UP}, {"bright": UP, "sat": UP, "color": DOWN})
    trends.append(trend("rho_09", "marble", {"bright": UP, "sat": UP, "color": DOWN}))
    trends.append(trend("eq", "equal_alpha", {"bright": UP, "sat": UP, "color": UP}))
    v = verdict(trends, SPEC)
    assert v.outcomes == {"marble": "marble_keeps_all_ws_dilutes", "rho_09": "marble_also_dilutes"}
    assert len(v.run_lines) == 4
    assert v.run_lines[1].startswith("`ws` (weighted_sum): bright +0.2 ± 0.071 (0.15 -> 0.35)")  # sqrt((.005+.005)/2)
    assert v.run_lines[1].endswith("Not improving: color.")
    assert v.run_lines[3].endswith("Every reward improved.")


def test_stderr_and_noise_caution():
    frame = metrics({"a": [1.0, 3.0, 2.0, 2.0, 3.0, 5.0]})
    change = reward_changes(frame, ["a"], window=2)["a"]
    # head [1, 3]: var 2; tail [3, 5]: var 2 -> stderr = sqrt((2 + 2) / 2)
    assert change.delta == pytest.approx(2.0)
    assert change.stderr == pytest.approx(math.sqrt(2.0))
    assert change.within_noise  # 2.0 < 2 * 1.414
    clear = reward_changes(metrics({"a": [1.0, 1.1, 2.0, 2.0, 3.0, 3.1]}), ["a"], window=2)["a"]
    assert clear.delta == pytest.approx(2.0) and not clear.within_noise
    noisy = [0.1, 0.5, 0.2, 0.6]  # +0.1 +- 0.28
    v = verdict(run_pair({"bright": UP, "sat": UP, "color": noisy},
                         {"bright": UP, "sat": UP, "color": DOWN}), SPEC)
    assert v.outcomes == {"marble": "marble_keeps_all_ws_dilutes"}
    assert "Caution: the specialist's change is within two standard errors" in v.text
    assert "in `marble`;" in v.text
    clean = verdict(run_pair({"bright": UP, "sat": UP, "color": UP},
                             {"bright": UP, "sat": UP, "color": DOWN}), SPEC)
    assert "Caution" not in clean.text


def test_identical_changes_under_both_balancers_are_not_credited():
    from marble.report.verdict import RewardChange, indistinguishable

    def run(name, balancer, delta):
        return RunTrend(name, balancer, {
            "bright": RewardChange("bright", 0.5, 0.5 + delta, delta, delta > 0, stderr=0.01),
            "color": RewardChange("color", 0.4, 0.4 + 0.17, 0.17, True, stderr=0.02),
        })

    same_m, same_w = run("marble", "marble", -0.0001), run("ws", "weighted_sum", -0.0002)
    assert indistinguishable(same_m, same_w)
    text = verdict([same_m, same_w], {"color": 0.1}).text
    assert "cannot tell them apart" in text
    apart = run("marble", "marble", 0.05)  # bright differs by 0.05 >> stderr 0.01
    assert not indistinguishable(apart, same_w)
    assert "cannot tell them apart" not in verdict([apart, same_w], {"color": 0.1}).text
