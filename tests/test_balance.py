"""min_norm_weights: simplex, KKT, ties and agreement with scipy SLSQP."""

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from marble.maths.qp import ENUM_MAX_K, min_norm_weights


def _slsqp(g):
    k = g.shape[0]
    res = minimize(lambda a: a @ g @ a, np.full(k, 1 / k), jac=lambda a: 2 * g @ a,
                   method="SLSQP", bounds=[(0, 1)] * k,
                   constraints=[{"type": "eq", "fun": lambda a: a.sum() - 1}],
                   options={"ftol": 1e-14, "maxiter": 1000})
    return res.x


def _unit_rows(rng, k, d):
    u = rng.normal(size=(k, d))
    return u / np.linalg.norm(u, axis=1, keepdims=True)


def _check(g, alpha):
    assert alpha.dtype == np.float64 and alpha.shape == (g.shape[0],)
    assert np.all(alpha >= 0) and alpha.sum() == pytest.approx(1.0, abs=1e-12)
    m = g @ alpha
    obj = alpha @ m
    active = alpha > 1e-9
    # KKT: <d, g_k> equals |d|^2 on the support and is no smaller elsewhere
    np.testing.assert_allclose(m[active], obj, atol=1e-8)
    assert np.all(m >= obj - 1e-8)
    ref = _slsqp(g)
    assert obj <= ref @ g @ ref + 1e-9
    assert abs(obj - ref @ g @ ref) < 1e-6


def _grams():
    rng = np.random.default_rng(1)
    cases = {}
    for k in range(2, 7):
        u = _unit_rows(rng, k, 20)
        cases[f"random_k{k}"] = u @ u.T
    u = _unit_rows(rng, 5, 3)  # 5 gradients in 3 dimensions
    cases["rank_deficient"] = u @ u.T
    u = _unit_rows(rng, 3, 10)
    dup = np.vstack([u, u[1:2]])
    cases["duplicate"] = dup @ dup.T
    zero = np.vstack([u, np.zeros((1, 10))])
    cases["zero_row"] = zero @ zero.T
    anti = np.vstack([u[0], -u[0], u[1]])
    cases["antipodal"] = anti @ anti.T
    v = rng.normal(size=(4, 6)) * np.array([[0.1], [1], [10], [3]])  # unnormalised
    cases["scaled"] = v @ v.T
    return cases


@pytest.mark.parametrize("name", sorted(_grams()))
def test_min_norm_kkt_and_scipy(name):
    g = _grams()[name]
    _check(g, min_norm_weights(g))


def test_zero_row_takes_all_weight():
    u = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    np.testing.assert_allclose(min_norm_weights(u @ u.T), [0, 0, 1], atol=1e-12)


def test_duplicates_share_weight_and_ties_are_min_norm():
    u = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    alpha = min_norm_weights(u @ u.T)
    # optimum d = (1/2, 1/2); among (a, 1/2 - a, 1/2) the min-norm point splits evenly
    np.testing.assert_allclose(alpha, [0.25, 0.25, 0.5], atol=1e-10)
    np.testing.assert_allclose(min_norm_weights(np.zeros((3, 3))), [1 / 3] * 3)


def test_a_near_tie_is_not_a_tie():
    """A vertex beats an edge by 4e-4 (relative): the tie tolerance must not trade it for
    the edge's smaller norm.

    v0 = (0.9995, 0), v1 = (1, 1.2), v2 = (1, -1.2). Every convex combination has first
    coordinate >= 0.9995, so |d|^2 >= 0.9995^2 = 0.99900 with equality only at alpha = e0
    (the optimum, by hand). The edge {1, 2} reaches (1, 0): |d|^2 = 1, norm^2(alpha) 1/2 < 1.
    Scaled by the largest diagonal (2.44) the gap is 4.1e-4: a tie only to a loose tolerance.
    """
    v = np.array([[0.9995, 0.0], [1.0, 1.2], [1.0, -1.2]])
    np.testing.assert_allclose(min_norm_weights(v @ v.T), [1.0, 0.0, 0.0], atol=1e-9)


def test_k1_and_k2_closed_form():
    np.testing.assert_allclose(min_norm_weights([[4.0]]), [1.0])
    g = np.array([[1.0, 0.3], [0.3, 1.0]])  # unit gradients: always (1/2, 1/2)
    np.testing.assert_allclose(min_norm_weights(g), [0.5, 0.5], atol=1e-12)
    g = np.array([[4.0, 1.0], [1.0, 2.0]])
    a1 = (g[1, 1] - g[0, 1]) / (g[0, 0] - 2 * g[0, 1] + g[1, 1])  # = 0.25
    np.testing.assert_allclose(min_norm_weights(g), [a1, 1 - a1], atol=1e-12)
    g = np.array([[1.0, 2.0], [2.0, 9.0]])  # clipped: alpha = e_1
    np.testing.assert_allclose(min_norm_weights(g), [1.0, 0.0], atol=1e-12)


def test_torch_input_and_deterministic():
    u = _unit_rows(np.random.default_rng(3), 4, 8)
    g = torch.tensor(u @ u.T, dtype=torch.float32)
    a, b = min_norm_weights(g), min_norm_weights(g)
    assert isinstance(a, np.ndarray) and a.dtype == np.float64
    assert np.array_equal(a, b)
    _check(g.double().numpy(), a)


def test_large_k_uses_frank_wolfe_and_agrees():
    u = _unit_rows(np.random.default_rng(4), ENUM_MAX_K + 2, 30)
    g = u @ u.T
    alpha = min_norm_weights(g)
    ref = _slsqp(g)
    assert abs(alpha @ g @ alpha - ref @ g @ ref) < 1e-6
    assert np.all(alpha >= 0) and alpha.sum() == pytest.approx(1.0)


def test_rejects_malformed():
    with pytest.raises(ValueError, match="square"):
        min_norm_weights(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="non-finite"):
        min_norm_weights(np.array([[1.0, np.nan], [np.nan, 1.0]]))
