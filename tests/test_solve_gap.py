"""Issue 26 item 4: a full solve never opposes a present reward (a theorem, tested as a
property on random Gram matrices), and the metrics that say where an applied direction
leaves the solve's combination (marble.balancers.solve.solve_gap_metrics)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from marble.balancers.solve import combine, solve_gap_metrics
from marble.maths.qp import min_norm_weights


def _gram_cases(rng, ks=range(2, 9)):
    """(K, vectors [K, D], valid mask): plain, rank-deficient, duplicated, masked (zero rows)."""
    for k in ks:
        yield k, rng.normal(size=(k, 16)), None
        yield k, rng.normal(size=(k, 2)), None  # D < K: the hull holds many dependent points
        x = rng.normal(size=(k, 16))
        x[-1] = x[0] * 3.0  # a duplicate direction with another norm
        yield k, x, None
        x = rng.normal(size=(k, 16))
        x[1] = 0.0  # a masked reward: no gradient this step
        yield k, x, 1
        yield k, -np.abs(rng.normal(size=(k, 16))) * np.sign(rng.normal(size=(1, 16))), None


def test_the_min_norm_point_is_never_anti_aligned_on_random_grams():
    """<d, u_k> = (G a)_k >= a^T G a = |d|^2 for every present k (the KKT conditions of the
    hull's min-norm point), on unit Gram matrices with K = 2..8, masked and degenerate."""
    rng = np.random.default_rng(26)
    checked = 0
    for _ in range(2):
        for k, x, masked in _gram_cases(rng):
            keep = [i for i in range(k) if i != masked]
            u = x[keep] / np.linalg.norm(x[keep], axis=1, keepdims=True)
            g = u @ u.T
            a = min_norm_weights(g)
            assert a.min() >= -1e-12 and abs(a.sum() - 1) < 1e-9
            assert np.all(g @ a >= a @ g @ a - 1e-9), (k, g @ a, a @ g @ a)
            checked += 1
    assert checked == 2 * 7 * 5


def test_combine_and_the_fresh_solve_keep_every_cosine_non_negative():
    """The same through `combine` on torch vectors (raw norms, a masked zero gradient): every
    full-solve combination has cos(d, g_k) >= -1e-6 for each present reward."""
    rng = np.random.default_rng(7)
    for _ in range(2):
        for k, x, _masked in _gram_cases(rng, ks=(2, 3, 5, 8)):
            grads = [torch.tensor(v, dtype=torch.float32) * float(rng.uniform(0.1, 10)) for v in x]
            gram = torch.tensor([[float(a @ b) for b in grads] for a in grads], dtype=torch.float64)
            d, _, _, norms, _ = combine(grads, gram, 1e-12)
            if float(d.norm()) < 1e-5 * norms.max():
                # 0 in the hull (D < K): Pareto-stationary, d = 0 and no cosine exists; the
                # inequality <d, g_k> >= |d|^2 = 0 holds, the property test covers it.
                assert x.shape[1] < k
                continue
            m = solve_gap_metrics([f"r{i}" for i in range(k)], d, grads, gram, 1e-12)
            assert float(m["cos_solve_min"]) >= -1e-6
            assert float(m["anti_aligned_solve"]) == 0.0
            assert float(m["angle_applied_solve"]) == pytest.approx(0.0, abs=1e-3)


def test_solve_gap_metrics_by_hand():
    """g1 = (1, 0), g2 = (0, 2): the solve puts alpha (1/2, 1/2) on the unit gradients, times
    the mean norm 1.5: d = (0.75, 0.75). An applied (-1, 1) opposes g1 (cos -1/sqrt 2), is 90
    degrees from d, and arccos(0.5 / (sqrt 2 sqrt 1.25)) = 71.565 degrees from the raw alpha
    combination (0.5, 1); with alpha (1/2, 1/2) the unit form is d itself; the KL gradient
    (1, 1) turns the update (-1, 1) into (0, 2), 45 degrees away."""
    grads = [torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0])]
    gram = torch.tensor([[1.0, 0.0], [0.0, 4.0]], dtype=torch.float64)
    applied = torch.tensor([-1.0, 1.0])
    m = solve_gap_metrics(["a", "b"], applied, grads, gram, 1e-12, alpha=np.array([0.5, 0.5]),
                          kl_grad=torch.tensor([1.0, 1.0]))
    assert float(m["cos_solve/a"]) == pytest.approx(1 / math.sqrt(2))
    assert float(m["angle_applied_solve"]) == pytest.approx(90.0)
    assert float(m["cos_alpha_unit_min"]) == pytest.approx(1 / math.sqrt(2))
    assert float(m["cos_alpha_raw/a"]) == pytest.approx(0.5 / math.sqrt(1.25))
    assert float(m["angle_applied_alpha_raw"]) == pytest.approx(
        math.degrees(math.acos(0.5 / (math.sqrt(2) * math.sqrt(1.25)))))
    assert float(m["angle_kl"]) == pytest.approx(45.0)  # (0, 2) = applied + KL against (-1, 1)
