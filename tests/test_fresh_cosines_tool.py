"""The smoke measurement of issue 37's options (beds.fresh_cosines) on two micro-batches."""

import pytest


def test_fresh_solve_never_opposes_a_reward_and_every_option_is_measured():
    from beds.fresh_cosines import OPTIONS, measure

    res = measure(2)
    assert set(res) == set(OPTIONS)
    assert all(r["micro_batches"] == 2 for r in res.values())
    # D.5: the min-norm point of the unit gradients has every cosine >= |d*| > 0
    assert res["fresh_param_solve"]["anti_aligned"] == 0.0
    assert res["fresh_param_solve"]["min_worst_cos"] > 0
    # another batch's alpha is not this batch's solve
    assert res["marble_ref"]["mean_worst_cos"] != pytest.approx(
        res["fresh_param_solve"]["mean_worst_cos"], abs=1e-3)
