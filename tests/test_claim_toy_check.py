"""Issue 47 item 1 by hand: can (b) be decided on the toy? Learnable alone in both seed halves,
room above, attenuated (0 < slope < 1) and not opposed in the weighted sum's advantage."""

from __future__ import annotations

import math

import pytest

from marble.experiments.claim_toy_check import attenuation_answer, b_conditions, learnable_in_halves, room_above
from marble.report.run_measures import RunMeasure


def test_attenuation_tells_attenuated_from_opposed_and_undecided():
    # [0.3, 0.35, 0.4]: mean 0.35, sd 0.05, se 0.05 / sqrt 3: t(> 0) = 12.1, t(< 1) = -22.5;
    # df 2: p = 1 - t / sqrt(t^2 + 2) = 0.0067 and 0.0020; Holm x2 / x1: both < 0.05
    got = attenuation_answer([0.3, 0.35, 0.4])
    t0 = 0.35 / (0.05 / math.sqrt(3))
    assert got["tests"]["above_0"]["p"] == pytest.approx(1 - t0 / math.sqrt(t0**2 + 2))
    assert got["answer"] == "attenuated" and got["mean"] == pytest.approx(0.35)
    assert attenuation_answer([-0.3, -0.35, -0.4])["answer"] == "opposed"
    assert attenuation_answer([1.3, 1.35, 1.4])["answer"] == "amplified"
    assert attenuation_answer([-0.3, 0.3, 0.1])["answer"] == "undecided"  # straddles 0


def test_learnable_in_both_halves_and_room_above():
    rises = {1: 0.1, 2: 0.12, 3: 0.11, 4: 0.1, 5: 0.12, 6: 0.11}
    got = learnable_in_halves(rises)
    assert got["seed_sets"] == [[1, 2, 3], [4, 5, 6]] and got["rises_in_both"] is True
    assert learnable_in_halves({**rises, 4: -0.1})["rises_in_both"] is False  # one half undecided
    # level 0.6 after gaining 0.1: room 0.4 > 0.1; level 0.95: room 0.05 < 0.1
    assert room_above([0.6, 0.6], [0.1, 0.1], "toy_left_bright")["answer"] is True
    assert room_above([0.95, 0.95], [0.1, 0.1], "toy_left_bright")["answer"] is False
    assert room_above([0.45], [0.01], "toy_text_contrast")["room"] == pytest.approx(0.05)  # max 0.5


def _m(arm, seed, change, slope, final):
    return RunMeasure(arm, seed, {"s": change}, {}, {}, math.nan, 0, 0, attenuation={"s": slope},
                      final={"s": final})


def test_b_conditions_need_all_three():
    ms = [_m("weighted_sum", s, 0.0, 0.3 + 0.01 * s, math.nan) for s in range(1, 7)]
    ms += [_m("alone_s", s, 0.1 + 0.01 * (s % 2), math.nan, 0.6) for s in range(1, 7)]
    got = b_conditions(ms, {"s": 0.3, "t": 0.3}, "weighted_sum")
    assert got["s"]["decidable"] is True and got["s"]["attenuation"]["answer"] == "attenuated"
    assert got["t"]["decidable"] is False and got["t"]["why"] == "no alone arm in the pilot"
    opposed = [_m("weighted_sum", s, 0.0, -0.3 - 0.01 * s, math.nan) for s in range(1, 7)]
    assert b_conditions(opposed + ms[6:], {"s": 0.3}, "weighted_sum")["s"]["decidable"] is False
