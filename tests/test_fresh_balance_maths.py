"""The maths of issue 37's options (marble.maths.fresh_balance) against hand calculations."""

import numpy as np
import pytest

from marble.maths.fresh_balance import (
    unit_form_weights,
    output_cosines,
    gram_weights,
    record_solve_norms,
    split_total,
)


def test_unit_form_weights_by_hand():
    # alpha (0.5, 0.5, 0), norms (2, 4, unmeasured), mean norm 3: w = (0.5*3/2, 0.5*3/4, 0)
    w = unit_form_weights([0.5, 0.5, 0.0], [2.0, 4.0, np.nan], 3.0)
    np.testing.assert_allclose(w, [0.75, 0.375, 0.0])
    # sum_k w_k g_k is the solve's rescaled unit direction: 3 * (0.5 g1/2 + 0.5 g2/4)
    g = np.array([[2.0, 0.0], [0.0, 4.0], [1.0, 1.0]])
    np.testing.assert_allclose(w @ g, 3.0 * (0.5 * g[0] / 2 + 0.5 * g[1] / 4))
    with pytest.raises(ValueError, match="differ"):
        unit_form_weights([1.0], [1.0, 2.0], 1.0)


def test_solve_norms_keep_an_absent_rewards_last_norm():
    norms, mean = record_solve_norms(None, [2.0, 4.0, 9.0], [True, True, False])
    np.testing.assert_array_equal(norms[:2], [2.0, 4.0])
    assert np.isnan(norms[2]) and mean == 3.0
    norms, mean = record_solve_norms(norms, [1.0, 5.0, 6.0], [False, True, True])
    np.testing.assert_array_equal(norms, [2.0, 5.0, 6.0])  # reward 0 keeps its last norm
    assert mean == 5.5  # the solve's own mean, over the rewards valid at it
    assert record_solve_norms(norms, [0.0] * 3, [False] * 3)[1] is None


def test_split_total_by_hand():
    point, total = split_total([1.0, 3.0])
    np.testing.assert_allclose(point, [0.25, 0.75])
    assert total == 4.0
    assert split_total([0.0, 0.0])[1] == 0.0
    with pytest.raises(ValueError, match=">= 0"):
        split_total([1.0, -1.0])


def test_output_space_two_rewards_closed_form():
    """K = 2 raw: alpha_1 = (G22 - G12) / (G11 - 2 G12 + G22), clipped to [0, 1]."""
    gram = np.array([[4.0, 1.0], [1.0, 2.0]])
    w, alpha, valid, norms, _ = gram_weights(gram, 1e-12, "raw")
    np.testing.assert_allclose(alpha, [0.25, 0.75])  # (2 - 1) / (4 - 2 + 2)
    np.testing.assert_allclose(w, alpha)
    np.testing.assert_allclose(norms, [2.0, np.sqrt(2.0)])
    # unit: with K = 2 unit gradients the min-norm point is the midpoint, alpha = (1/2, 1/2),
    # rescaled by the mean norm: w_k = 0.5 * mean(2, sqrt 2) / |u_k|
    w, alpha, _, _, _ = gram_weights(gram, 1e-12, "unit")
    mean = (2.0 + np.sqrt(2.0)) / 2
    np.testing.assert_allclose(alpha, [0.5, 0.5])
    np.testing.assert_allclose(w, [0.5 * mean / 2.0, 0.5 * mean / np.sqrt(2.0)])


def test_output_space_orthogonal_case_and_cosines_by_hand():
    # u1 = (2, 0), u2 = (0, 1): raw alpha = (1/5, 4/5), d = (0.4, 0.8), <d, u_k> = 0.8 = |d|^2
    gram = np.array([[4.0, 0.0], [0.0, 1.0]])
    w, alpha, _, _, _ = gram_weights(gram, 1e-12, "raw")
    np.testing.assert_allclose(alpha, [0.2, 0.8])
    cos = output_cosines(gram, w)
    np.testing.assert_allclose(cos, [0.8 / (np.sqrt(0.8) * 2), 0.8 / np.sqrt(0.8)])
    # unit: alpha (1/2, 1/2), mean norm 1.5, w = (0.375, 0.75), d = (0.75, 0.75): 45 degrees to both
    w, _, _, _, _ = gram_weights(gram, 1e-12, "unit")
    np.testing.assert_allclose(w, [0.375, 0.75])
    np.testing.assert_allclose(output_cosines(gram, w), [np.sqrt(0.5)] * 2)


def test_output_space_invalid_rewards_and_bad_mode():
    gram = np.diag([0.0, 9.0, 0.0])  # one valid reward: its raw gradient, weight 1
    w, alpha, valid, _, _ = gram_weights(gram, 1e-12, "unit")
    np.testing.assert_array_equal(valid, [False, True, False])
    np.testing.assert_array_equal(w, [0.0, 1.0, 0.0])
    np.testing.assert_array_equal(alpha, [0.0, 1.0, 0.0])
    w, alpha, valid, _, _ = gram_weights(np.zeros((2, 2)), 1e-12, "raw")
    assert not valid.any() and not w.any()
    assert np.isnan(output_cosines(np.zeros((2, 2)), w)).all()
    with pytest.raises(ValueError, match="unit"):
        gram_weights(gram, 1e-12, "sphere")
