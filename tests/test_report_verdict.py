"""Training-reward changes, specialists and per-run lines against hand calculations (the claim's
answers: tests/test_report_claim.py, tests/test_claim_stats.py)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from marble.report.verdict import (
    RunTrend,
    auto_window,
    reward_changes,
    run_line,
    specialist_rewards,
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


UP, DOWN = [0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]
SPEC = {"color": 1 / 3}


def test_run_lines():
    ws = trend("ws", "weighted_sum", {"bright": UP, "sat": UP, "color": DOWN})
    line = run_line(ws, SPEC)
    assert line.startswith("`ws` (weighted_sum): bright +0.2 ± 0.071 (0.15 -> 0.35)")  # sqrt((.005+.005)/2)
    assert "color (specialist) -0.2" in line and line.endswith("Not improving: color.")
    assert run_line(trend("eq", "equal_alpha", {"bright": UP}), SPEC).endswith("Every reward improved.")


def test_stderr_from_the_epoch_windows():
    frame = metrics({"a": [1.0, 3.0, 2.0, 2.0, 3.0, 5.0]})
    change = reward_changes(frame, ["a"], window=2)["a"]
    # head [1, 3]: var 2; tail [3, 5]: var 2 -> stderr = sqrt((2 + 2) / 2)
    assert change.delta == pytest.approx(2.0)
    assert change.stderr == pytest.approx(math.sqrt(2.0))
    assert math.isnan(reward_changes(frame, ["a"], window=1)["a"].stderr)  # one epoch: no spread


def test_the_min_norm_sentence_follows_the_descriptors():
    """"A fresh min-norm solve cannot oppose a reward" holds for an exact min-norm QP only: it is
    said for the balancers whose descriptor has `min_norm_tol`, never for another that solves
    (a torchjd weighting), and named when both kinds solved."""
    from marble.config_balancers import BALANCERS
    from marble.report.demo_claim import step_kind_text

    iv = {"mean": 0.1, "low": 0.0, "high": 0.2, "n": 2, "sd": 0.1}
    kind = {"full_solve": iv, "amortized": iv, "solve_steps": 3}
    min_norm = [m for m, d in BALANCERS.items() if d.min_norm_tol is not None]
    other = [m for m, d in BALANCERS.items() if d.min_norm_tol is None]
    sentence = "cannot oppose a reward"
    assert sentence in step_kind_text({min_norm[0]: kind})
    assert f"solve ({min_norm[0]}) {sentence}" in step_kind_text({min_norm[0]: kind, other[0]: kind})
    text = step_kind_text({m: kind for m in other})
    assert sentence not in text and text.startswith(" Split by step kind: ")
