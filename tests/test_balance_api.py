"""`marble.balance`, the library API: weights and directions against hand calculations, the
solve-every-N schedule, the alpha EMA, absent rewards, checkpoints, every balancer name, and
the README's example run as written (it is also docs/balancers.md's).

Hand calculations use 2-D gradients: a solve normalises them (u_k = g_k / |g_k|), takes the
min-norm point of their hull (two unit vectors: always alpha = (1/2, 1/2)) and rescales by the
mean norm; an amortized step applies the cached alpha to the raw gradients.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from extras import needs
import torch

from marble.balance import METHODS, Balancer
from marble.config_balancers import balancer_descriptor

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## MARBLE as a library"


def t(*xs):
    return torch.tensor(xs, dtype=torch.float32)


def close(got: dict, want: dict, tol=1e-9):
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k], abs=tol), (k, got, want)


# ------------------------------------------------------------------ one solve, by hand


def test_orthogonal_unit_gradients_split_evenly():
    out = Balancer("mgda", rewards=["a", "b"]).combine({"a": t(1, 0), "b": t(0, 1)})
    assert out.solved
    close(out.weights, {"a": 0.5, "b": 0.5})
    assert torch.allclose(out.direction, t(0.5, 0.5))


def test_a_dominating_gradient_does_not_dominate_the_direction():
    # |g_a| = 3, |g_b| = 1: mean norm 2, d = 2 (u_a + u_b) / 2 = (1, 1); c_k = alpha_k 2 / |g_k|.
    grads = {"a": t(3, 0), "b": t(0, 1)}
    out = Balancer("marble", rewards=["a", "b"]).combine(grads)
    close(out.weights, {"a": 0.5, "b": 0.5})
    close(out.coefficients, {"a": 1 / 3, "b": 1.0})
    assert torch.allclose(out.direction, t(1.0, 1.0))
    # The weighted sum follows the larger gradient: (3 + 0, 0 + 1) / 2.
    assert torch.allclose(Balancer("weighted_sum", rewards=["a", "b"]).combine(grads).direction, t(1.5, 0.5))


def test_anti_aligned_gradients_give_the_zero_direction():
    # u_a = -u_b: the hull holds 0, a Pareto-stationary point; nothing moves.
    out = Balancer("mgda", rewards=["a", "b"]).combine({"a": t(1, 0), "b": t(-2, 0)})
    close(out.weights, {"a": 0.5, "b": 0.5})
    assert torch.allclose(out.direction, t(0, 0), atol=1e-7)


def test_three_rewards_a_duplicate_shares_its_weight_and_a_redundant_one_gets_none():
    bal = Balancer("mgda", rewards=["a", "b", "c"])
    # b = c: the hull is the segment u_a..u_b, its min-norm point (1/2, 1/2), split evenly.
    close(bal.combine({"a": t(1, 0), "b": t(0, 1), "c": t(0, 1)}).weights, {"a": 0.5, "b": 0.25, "c": 0.25})
    # c = (u_a + u_b) / sqrt 2 lies beyond the segment's midpoint: alpha_c = 0.
    diag = t(1, 1) / 2 ** 0.5
    close(bal.combine({"a": t(1, 0), "b": t(0, 1), "c": diag}).weights, {"a": 0.5, "b": 0.5, "c": 0.0})


# ------------------------------------------------------------------ schedule and EMA


def test_solve_every_n_reuses_the_cached_weights_between_solves():
    bal = Balancer("marble", rewards=["a", "b"], solve_every=3, warmup_steps=1)
    grads = {"a": t(3, 0), "b": t(0, 1)}
    outs = [bal.combine(grads) for _ in range(7)]
    assert [o.solved for o in outs] == [True, False, False, True, False, False, True]
    assert [o.step for o in outs] == list(range(7))
    for o in outs:
        close(o.weights, {"a": 0.5, "b": 0.5})
    # Amortized: alpha on the raw gradients, 0.5 (3, 0) + 0.5 (0, 1), not the solve's (1, 1).
    assert torch.allclose(outs[1].direction, t(1.5, 0.5))
    assert torch.allclose(outs[3].direction, t(1.0, 1.0))


def test_warmup_solves_every_step_before_it():
    bal = Balancer("marble", rewards=["a", "b"], solve_every=10, warmup_steps=3)
    assert [bal.combine({"a": t(1, 0), "b": t(0, 1)}).solved for _ in range(5)] == [True, True, True, False, False]


def test_rho_ema_of_the_solved_alphas():
    bal = Balancer("marble", rewards=["a", "b", "c"], solve_every=2, rho=0.7)
    first = bal.combine({"a": t(1, 0, 0), "b": t(0, 1, 0), "c": t(0, 1, 0)})  # (1/2, 1/4, 1/4)
    close(bal.cached_weights, {"a": 0.5, "b": 0.25, "c": 0.25})
    amortized = bal.combine({"a": t(1, 0, 0), "b": t(0, 1, 0), "c": t(0, 0, 1)})
    assert first.solved and not amortized.solved
    close(amortized.weights, {"a": 0.5, "b": 0.25, "c": 0.25})  # the cache, not this step's 1/3
    second = bal.combine({"a": t(1, 0, 0), "b": t(0, 1, 0), "c": t(0, 0, 1)})  # alpha = 1/3 each
    close(second.weights, {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3})
    # 0.7 (1/2, 1/4, 1/4) + 0.3 (1/3, 1/3, 1/3) = (0.45, 0.275, 0.275)
    close(bal.cached_weights, {"a": 0.45, "b": 0.275, "c": 0.275})
    after = bal.combine({"a": t(2, 0, 0), "b": t(0, 1, 0), "c": t(0, 0, 4)})
    close(after.weights, {"a": 0.45, "b": 0.275, "c": 0.275})
    assert torch.allclose(after.direction, t(0.9, 0.275, 1.1))


# ------------------------------------------------------------------ absent rewards


def test_an_absent_reward_gets_weight_zero_in_a_solve_and_the_rest_renormalise():
    bal = Balancer("marble", rewards=["a", "b", "c"], solve_every=1, rho=0.7)
    out = bal.combine({"a": t(2, 0), "b": t(0, 1)})  # c missing
    close(out.weights, {"a": 0.5, "b": 0.5, "c": 0.0})
    out = bal.combine({"a": t(2, 0), "b": t(float("nan"), 1), "c": None})  # b not finite, c None
    close(out.weights, {"a": 1.0, "b": 0.0, "c": 0.0})
    assert torch.allclose(out.direction, t(2, 0))  # one valid reward: its raw gradient
    # The EMA takes the masked solve in with its zero: 0.7 (1/2, 1/2, 0) + 0.3 (1, 0, 0).
    close(bal.cached_weights, {"a": 0.65, "b": 0.35, "c": 0.0})


def test_an_absent_reward_in_an_amortized_step_is_left_out_without_renormalising():
    # The trainer's exact masking: sum_k alpha_k L_k with L_k = 0 for a reward without a sample.
    bal = Balancer("marble", rewards=["a", "b"], solve_every=5)
    bal.combine({"a": t(1, 0), "b": t(0, 1)})
    out = bal.combine({"a": t(4, 0)})
    assert not out.solved
    close(out.weights, {"a": 0.5, "b": 0.0})
    assert torch.allclose(out.direction, t(2, 0))
    # The weighted sum is a mean over the rewards present (the trainer's NaN-aware mean reward).
    ws = Balancer("weighted_sum", rewards=["a", "b"], reward_weights=[1.0, 3.0])
    close(ws.combine({"a": t(4, 0), "b": t(0, 4)}).weights, {"a": 0.25, "b": 0.75})
    close(ws.combine({"a": t(4, 0)}).weights, {"a": 1.0, "b": 0.0})


def test_a_nan_loss_is_absent():
    w = torch.nn.Parameter(torch.zeros(2))
    losses = {"a": ((w - t(1, 0)) ** 2).sum(), "b": (w * float("nan")).sum()}
    out = Balancer("mgda", rewards=["a", "b"]).step(losses, [w])
    close(out.weights, {"a": 1.0, "b": 0.0})
    assert torch.allclose(w.grad, t(-2, 0))


# ------------------------------------------------------------------ losses = gradients


def _quadratic_losses(w):
    # L_a = |w - (1, 0)|^2, L_b = |w - (0, 2)|^2: at w = 0, g_a = (-2, 0), g_b = (0, -4).
    return {"a": ((w - t(1, 0)) ** 2).sum(), "b": ((w - t(0, 2)) ** 2).sum()}


@pytest.mark.parametrize("backward", [True, False])
def test_losses_give_the_direction_of_their_gradients(backward):
    bal = Balancer("marble", rewards=["a", "b"], solve_every=2)
    for want_solved, want in [(True, t(-1.5, -1.5)), (False, t(-1.0, -2.0))]:  # 3 (u_a + u_b) / 2, then raw
        w = torch.nn.Parameter(torch.zeros(2))
        out = bal.step(_quadratic_losses(w), [w], backward=backward)
        assert out.solved == want_solved
        if not backward:
            assert w.grad is None and out.loss.requires_grad
            out.loss.backward()
        assert torch.allclose(w.grad, want)
        # loss = sum_k c_k L_k at w = 0: L_a = 1, L_b = 4.
        assert float(out.loss.detach()) == pytest.approx(out.coefficients["a"] * 1 + out.coefficients["b"] * 4)


def test_step_accumulates_into_existing_grads():
    w = torch.nn.Parameter(torch.zeros(2))
    w.grad = t(10, 10)
    Balancer("mgda", rewards=["a", "b"]).step(_quadratic_losses(w), [w])
    assert torch.allclose(w.grad, t(8.5, 8.5))


# ------------------------------------------------------------------ checkpoints


def test_state_dict_round_trip_gives_identical_subsequent_weights():
    gen = torch.Generator().manual_seed(0)
    grads = [{k: torch.randn(5, generator=gen) for k in "abc"} for _ in range(12)]
    grads[7]["b"] = None
    first = Balancer("marble", rewards=list("abc"), solve_every=3, rho=0.6)
    for g in grads[:5]:
        first.combine(g)
    saved = json.loads(json.dumps(first.state_dict()))  # plain numbers: any checkpoint format
    resumed = Balancer("marble", rewards=list("abc"), solve_every=3, rho=0.6)
    resumed.load_state_dict(saved)
    fresh = Balancer("marble", rewards=list("abc"), solve_every=3, rho=0.6)
    for n, g in enumerate(grads[5:]):
        a, b, c = first.combine(g), resumed.combine(g), fresh.combine(g)
        assert (a.step, a.solved, a.weights) == (b.step, b.solved, b.weights)
        assert torch.equal(a.direction, b.direction)
        if n == 0:  # step 5 is amortized; without the state the schedule restarts with a solve
            assert not a.solved and c.solved and c.step == 0


@pytest.mark.parametrize("weighting", ["upgrad", "nash_mtl"])
def test_a_zoo_weighting_resumes_with_its_cache_and_state(weighting):
    """UPGrad's cache is off the simplex; Nash-MTL keeps a warm start of its own."""
    needs("torchjd.aggregation", "zoo")
    gen = torch.Generator().manual_seed(1)
    grads = [{k: torch.randn(4, generator=gen) for k in "abc"} for _ in range(6)]
    first = Balancer("gramian", rewards=list("abc"), weighting=weighting, solve_every=2)
    for g in grads[:3]:
        first.combine(g)
    state = json.loads(json.dumps(first.state_dict()))
    # Nash-MTL's warm start travels too (without it the solve at step 4 differs).
    assert bool(state["balancer"]["weighting_state"]) == (weighting == "nash_mtl")
    resumed = Balancer("gramian", rewards=list("abc"), weighting=weighting, solve_every=2)
    resumed.load_state_dict(state)
    for g in grads[3:]:
        a, b = first.combine(g), resumed.combine(g)
        assert (a.solved, a.weights) == (b.solved, b.weights)


def test_a_state_of_other_rewards_or_format_is_refused():
    state = Balancer("marble", rewards=["a", "b"]).state_dict()
    with pytest.raises(ValueError, match="rewards"):
        Balancer("marble", rewards=["a", "c"]).load_state_dict(state)
    with pytest.raises(ValueError, match="format"):
        Balancer("marble", rewards=["a", "b"]).load_state_dict(state["balancer"])


# ------------------------------------------------------------------ every name, bad input


def _kwargs(method: str) -> dict:
    if balancer_descriptor(method).cadence == "zoo":  # a torchjd weighting, named
        needs("torchjd.aggregation", "zoo")
        return {"weighting": "mgda"}
    return {}


# The dominating case of above, (3, 0) and (0, 1), on each method's first step: the methods
# that solve (read off each one's descriptor, so a new balancer needs no edit here) reach (1, 1),
# the others average the raw gradients to (1.5, 0.5).


def solves_on_its_first_step(method: str) -> bool:
    """A cached schedule solves at step 0; a min-norm method solves every step."""
    d = balancer_descriptor(method)
    return d.cached or d.min_norm_tol is not None


@pytest.mark.parametrize("method", METHODS)
def test_every_balancer_name_is_accepted(method):
    solves = solves_on_its_first_step(method)
    bal = Balancer(method, rewards=["a", "b"], **_kwargs(method))
    out = bal.combine({"a": t(3, 0), "b": t(0, 1)})
    assert out.solved == solves
    close(out.weights, {"a": 0.5, "b": 0.5}, tol=1e-6)
    assert torch.allclose(out.direction, t(1, 1) if solves else t(1.5, 0.5), atol=1e-5)
    w = torch.nn.Parameter(torch.zeros(2))
    Balancer(method, rewards=["a", "b"], **_kwargs(method)).step(_quadratic_losses(w), [w])
    assert torch.allclose(w.grad, t(-1.5, -1.5) if solves else t(-1.0, -2.0), atol=1e-5)


def test_equal_alpha_takes_fixed_alphas():
    out = Balancer("equal_alpha", rewards=["a", "b"], fixed_alphas=[0.25, 0.75]).combine({"a": t(4, 0), "b": t(0, 4)})
    assert torch.allclose(out.direction, t(1, 3))


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError) as err:
        Balancer("pareto", rewards=["a"])
    assert "'pareto'" in str(err.value)
    assert all(name in str(err.value) for name in METHODS)
    assert "upgrad" in str(err.value)  # and the weightings gramian takes


@pytest.mark.parametrize("kwargs, message", [
    ({"rho": 1.0}, r"rho = 1.0 must be in \[0, 1\)"),
    ({"solve_every": 0}, "solve_every = 0 must be > 0"),
    ({"solve_every": 2.5}, "solve_every = 2.5 must be an integer"),
    ({"rho": float("nan")}, "rho = nan must be in"),
    ({"weighting": "upgrad"}, "weighting= goes with method 'gramian'"),
    ({"fixed_alphas": [0.5, 0.5]}, "fixed_alphas= goes with method 'equal_alpha'"),
    ({"reward_weights": [1.0]}, "reward_weights must be 2"),
    ({"method": "gramian"}, "method 'gramian' needs weighting= one of mgda, upgrad"),
    ({"method": "gramian", "weighting": "pareto"}, "got 'pareto'"),
])
def test_bad_options_are_one_line_errors(kwargs, message):
    kwargs = {"method": "marble", **kwargs}
    with pytest.raises(ValueError, match=message):
        Balancer(rewards=["a", "b"], **kwargs)


def test_unknown_reward_keys_and_non_scalar_losses_are_errors():
    bal = Balancer("marble", rewards=["a", "b"])
    w = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(ValueError, match=r"unknown rewards \['z'\]"):
        bal.step({"a": w.sum(), "z": w.sum()}, [w])
    with pytest.raises(ValueError, match="scalar"):
        bal.step({"a": w * 2}, [w])
    with pytest.raises(ValueError, match="different shapes"):
        bal.combine({"a": t(1, 0), "b": t(1, 0, 0)})


def test_the_callers_gradients_are_not_modified():
    g = {"a": t(3, float("inf")), "b": t(0, 1)}
    Balancer("mgda", rewards=["a", "b"]).combine(g)
    assert torch.equal(g["a"], t(3, float("inf")))


# ------------------------------------------------------------------ the toy example


def readme_snippet(path: Path = ROOT / "README.md") -> str:
    """The fenced python block of the README's library section, as written."""
    text = path.read_text(encoding="utf-8")
    section = text[text.index(SECTION):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_example_runs_as_written_and_prints_what_it_says(capsys):
    code = readme_snippet()
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    printed = ast.literal_eval(capsys.readouterr().out.strip().splitlines()[-1])
    said = ast.literal_eval(code.strip().splitlines()[-1].split("#", 1)[1].strip())
    assert printed == said  # the comment shows what the snippet prints
    assert namespace["out"].step == 29


def test_docs_balancers_shows_the_same_example():
    assert readme_snippet(ROOT / "docs" / "balancers.md") == readme_snippet()


def test_marble_balances_a_toy_model_better_than_the_weighted_sum():
    """The README's toy: one linear model, three regression targets (two nearly alike). The
    weighted sum's optimum is their mean, far from the odd one out; MARBLE stops where no loss
    improves without another worsening, with the worst loss much lower."""
    torch.manual_seed(0)
    x = torch.randn(256, 3)
    targets = {"pick": x @ t(1, 2, 0), "hps": x @ t(1, 2, 0.2), "ocr": x @ t(1, -2, 0.5)}

    def train(method: str) -> dict:
        torch.manual_seed(1)
        model = torch.nn.Linear(3, 1)
        bal = Balancer(method, rewards=list(targets), solve_every=5)
        for _ in range(30):
            pred = model(x).squeeze(1)
            bal.step({k: ((pred - y) ** 2).mean() for k, y in targets.items()}, model.parameters())
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.1 * p.grad
                    p.grad = None
        pred = model(x).squeeze(1).detach()
        return {k: float(((pred - y) ** 2).mean()) for k, y in targets.items()}

    ws, marble = train("weighted_sum"), train("marble")
    # The weighted sum's optimum w = (1, 2/3, 0.23): ocr's error (0, 8/3, 0.27) squared ~ 7.2.
    assert max(ws.values()) > 6.5
    assert max(marble.values()) < 0.7 * max(ws.values())
