"""`marble.balance` beyond one call per optimizer step (issue 46 item 4, issue 49 item 4):
gradient accumulation on the trainer's schedule, the config's options, and the errors that
used to be silent."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from marble.balance import Balancer
from marble.balancers import build_balancer
from marble.config import BalancerConfig


def _losses(w):
    return {"a": (w[0] - 1) ** 2 + 0.1 * w[1] ** 2, "b": (w[1] + 2) ** 2 + 0.3 * w[0] ** 2}


def _trainer_solves(steps, accumulation, **cfg):
    """Which micro-steps the trainer's strategy solves on (marble.balancers.cadence's walk)."""
    bal = build_balancer(BalancerConfig(diagnostics_every=0, **cfg), ["a", "b"])
    out = []
    for g in range(steps):
        for i in range(accumulation):
            at = SimpleNamespace(global_step=g, micro_index=i)
            full = bal.wants_full_solve(at)
            if full:
                bal.solved(at, np.array([0.5, 0.5]), np.ones(2, bool), {})
            out.append(full)
    return out


@pytest.mark.parametrize("accumulation", [1, 3])
def test_an_accumulation_loop_solves_on_the_trainers_micro_steps(accumulation):
    w = torch.nn.Parameter(torch.tensor([0.3, -0.2]))
    bal = Balancer("marble", rewards=["a", "b"], solve_every=2, warmup_steps=1,
                   accumulation=accumulation)
    got, where = [], []
    for _ in range(5 * accumulation):
        out = bal.step(_losses(w), [w])
        got.append(out.solved)
        where.append((out.step, out.micro_index))
    want = _trainer_solves(5, accumulation, method="marble", amortize_every=2, warmup_steps=1)
    assert got == want
    assert where == [(g, i) for g in range(5) for i in range(accumulation)]
    if accumulation == 3:  # warm-up step 0: every micro-step; then micro-step 0 of steps 2, 4
        assert got == [True] * 3 + [False] * 3 + [True, False, False] + [False] * 3 + [True, False, False]


def test_the_config_options_are_accepted():
    w = torch.nn.Parameter(torch.tensor([0.3, -0.2]))
    # norm_corrected: on unchanged losses the amortized step repeats the solve's direction
    bal = Balancer("marble", rewards=["a", "b"], solve_every=5, rho=0.0,
                   cached_weights="norm_corrected")
    solve = bal.step(_losses(w), [w], backward=False)
    amortized = bal.step(_losses(w), [w], backward=False)
    assert solve.solved and not amortized.solved
    np.testing.assert_allclose(list(amortized.coefficients.values()),
                               list(solve.coefficients.values()), rtol=1e-9)
    # fresh: exact solves on every call
    exact = Balancer("marble", rewards=["a", "b"], fresh="exact", rho=0.0)
    assert all(exact.step(_losses(w), [w], backward=False).solved for _ in range(3))
    with pytest.raises(ValueError, match="zoo_gradients"):
        Balancer("marble", rewards=["a", "b"], zoo_gradients="raw")
    with pytest.raises(ValueError, match="gram_space = 'output'"):
        Balancer("marble", rewards=["a", "b"], gram_space="output")
    with pytest.raises(ValueError, match="accumulation"):
        Balancer("marble", rewards=["a", "b"], accumulation=0)


def test_silent_mistakes_are_errors():
    w = torch.nn.Parameter(torch.tensor([0.3, -0.2]))
    bal = Balancer("marble", rewards=["a", "b"])
    with pytest.raises(ValueError, match="no grad_fn"):
        bal.step({"a": _losses(w)["a"], "b": torch.tensor(1.0)}, [w])
    with pytest.raises(ValueError, match="no reward's loss is present"):
        bal.step({"a": None, "b": torch.tensor(float("nan"))}, [w])
    assert bal.steps == 0  # nothing counted
    with pytest.raises(TypeError, match="dict reward name"):
        bal.step([_losses(w)["a"], _losses(w)["b"]], [w])
    with pytest.raises(TypeError, match="flattened"):
        bal.combine({"a": [torch.ones(2), torch.ones(3)], "b": torch.ones(5)})
    with pytest.raises(ValueError, match="passed twice"):
        bal.step(_losses(w), [w, w])


@pytest.mark.parametrize("method", ["weighted_sum", "marble"])
def test_a_finite_loss_with_a_non_finite_gradient_is_refused(method):
    w = torch.nn.Parameter(torch.tensor([0.0, 1.0]))
    losses = {"a": torch.sqrt(w[0].abs()) * 0 + w[1], "b": w[1] ** 2}  # d sqrt(|x|)/dx at 0: inf
    assert torch.isfinite(losses["a"])
    with pytest.raises(FloatingPointError, match="non-finite"):
        Balancer(method, rewards=["a", "b"]).step(losses, [w])
    assert w.grad is None
