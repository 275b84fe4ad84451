"""MARBLE's multi-reward balancing for any training loop (Flow-GRPO, DiffusionNFT, any multi-loss model).

Two calls, as torchjd's aggregators::

    bal = marble.balance.Balancer("marble", rewards=["pick", "ocr"], solve_every=5, rho=0.7)
    out = bal.step({"pick": l1, "ocr": l2}, model.parameters())  # adds the balanced gradient to .grad

`out.weights` are the per-reward weights alpha, `out.solved` says whether this step ran a full
solve. `bal.combine({"pick": g1, "ocr": g2})` does the same on per-reward gradients you computed
yourself and returns the combined direction (`out.direction`) instead of touching `.grad`.

One call is one optimizer step of the schedule (docs/algorithm.md §7.5), the project's own
balancer objects (marble/balancers/) deciding it:

- a **full solve** (every step of `mgda`; for `marble` and `gramian` the first step, every step
  before `warmup_steps` and then every `solve_every` steps): the per-reward gradients g_k, alpha
  from the min-norm QP on the unit gradients (`marble.maths.qp.min_norm_weights`; `gramian`: the
  torchjd weighting named by `weighting`), the direction |g|_mean sum_k alpha_k g_k / |g_k|
  (marble/balancers/solve.py `combine`), then the alpha cache <- rho cache + (1 - rho) alpha;
- an **amortized step** in between: the cached alpha applied to this step's losses,
  sum_k alpha_k L_k, one backward;
- `equal_alpha` (1/K or `fixed_alphas`) and `weighted_sum` never solve; `gdpo` and
  `reward_sum` differ from the weighted sum only in the advantage they are trained on
  (`marble.maths.advantage_balancers` computes it), so on losses they are its step.

Gradient accumulation: with `accumulation=M`, one call is one micro-step and M calls one
optimizer step, on the trainer's schedule: a solve runs on micro-step 0 of a solving step
(every micro-step before `warmup_steps`), the cached alpha on the others::

    bal = marble.balance.Balancer("marble", rewards=["pick", "ocr"], accumulation=4)
    for micro_batch in batches:  # 4 per optimizer step
        out = bal.step(losses_of(micro_batch), model.parameters())  # out.micro_index: 0..3
        if out.micro_index == 3:
            optimizer.step(); optimizer.zero_grad()

Absent rewards: a loss or gradient that is missing, None or not finite has weight 0. A solve
then runs on the rewards present (their alpha on the simplex); an amortized step applies the
cached alpha to the present losses and leaves the absent one out, without renormalising: the
trainer's exact masking (docs/algorithm.md §7.6, sum_k alpha_k L_k with L_k = 0 when reward k has
no sample). The weighted sum renormalises its weights over the rewards present (the trainer's
NaN-aware mean reward). Under torch.distributed the per-reward gradients of a solve are averaged
over the ranks, as in training; the amortized backward is reduced by your DDP as usual.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np
import torch

from marble.balancers import STRATEGIES, build_balancer
from marble.balancers.common import add_into_grads, flat_grad, flat_zeros
from marble.balancers.solve import combine, reduce_reward_grads
from marble.balancers.weightings import weighting_names
from marble.config import BalancerConfig, fresh_balance_problem
from marble.config_ranges import RANGES
from marble.maths.fresh_balance import unit_form_weights

__all__ = ["Balancer", "Balanced", "METHODS"]  # noqa: F822 - METHODS is served by __getattr__ below


def __getattr__(name: str):
    """`METHODS`: the balancer names registered now (marble.balancers' live registry), never an
    import-time copy: `from marble.balancers import METHODS` here would freeze it."""
    if name == "METHODS":
        return tuple(STRATEGIES)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

STATE_FORMAT = "marble.balance/1"

# The keyword arguments and the config keys whose ranges they share (marble/config_ranges.py).
_RANGED = {"solve_every": "balancer.amortize_every", "warmup_steps": "balancer.warmup_steps",
           "rho": "balancer.alpha_ema", "grad_eps": "balancer.grad_eps"}


@dataclass(frozen=True)
class Balanced:
    """What one step of a `Balancer` applied.

    weights: alpha per reward (0 for an absent one); on a solve the QP's (or the weighting's) alpha.
    coefficients: what multiplies each reward's raw loss / gradient in the applied direction:
        alpha_k |g|_mean / |g_k| on a solve (the unit-gradient form), alpha_k otherwise.
    solved: whether this step ran a full solve.
    step: the optimizer step of the schedule (0 for the first call); micro_index: the call's
        micro-step within it (always 0 without `accumulation`).
    loss: sum_k coefficients_k L_k (`step`; None from `combine`): detached once backpropagated,
        with its graph when `step(..., backward=False)` leaves the backward to you.
    direction: sum_k coefficients_k g_k in the gradients' shape (`combine`; None from `step`).
    """

    weights: dict[str, float]
    coefficients: dict[str, float]
    solved: bool
    step: int
    loss: Optional[torch.Tensor] = None
    direction: Optional[torch.Tensor] = None
    micro_index: int = 0


class Balancer:
    """One of the project's balancers (`METHODS`) on per-reward losses or gradients.

    method: weighted_sum, equal_alpha, mgda, marble, gramian (with `weighting`, one of
        marble/balancers/weightings.py: upgrad, cagrad, nash_mtl, ...; torchjd needed), gdpo,
        reward_sum.
    rewards: the reward (loss) names, in the order the weights are reported.
    solve_every: N, steps between full solves (marble, gramian); warmup_steps: every step before
        this one solves; rho: the EMA of the cached alpha, in [0, 1).
    fixed_alphas: equal_alpha's weights (default 1/K); reward_weights: the weighted sum's
        (weighted_sum, gdpo, reward_sum; default 1 each); weighting_options: the torchjd
        constructor's options; grad_eps: a gradient of norm <= this counts as absent.
    accumulation: micro-steps (calls) per optimizer step (the trainer's gradient accumulation).
    The config's options beyond the reference (docs/balancers.md), by their config names:
    cached_weights ("reference" | "norm_corrected": the cached alpha in the last solve's unit
    form), zoo_gradients ("unit" | "raw", gramian), fresh ("cached" | "exact": a solve on every
    call; here from one gradient pass per reward, the per-sample construction needs the
    trainer's micro-step), gram_space ("parameters" only: "output" needs the model's prediction
    and loss head, which a loss does not carry).
    Defaults are the paper's (N = 10, warm-up 1, rho = 0.7).
    """

    def __init__(self, method: str = "marble", rewards: Sequence[str] = (), *, solve_every: int = 10,
                 rho: float = 0.7, warmup_steps: int = 1, weighting: str | None = None,
                 weighting_options: Mapping[str, Any] | None = None,
                 fixed_alphas: Sequence[float] | None = None,
                 reward_weights: Sequence[float] | None = None, grad_eps: float = 1e-12,
                 accumulation: int = 1, cached_weights: str = "reference",
                 gram_space: str = "parameters", zoo_gradients: str = "unit",
                 fresh: str = "cached"):
        if method not in STRATEGIES:  # live: a balancer added with marble.balancers.register counts
            raise ValueError(f"unknown balancer {method!r}: expected one of {', '.join(STRATEGIES)} "
                             f"(gramian takes weighting= one of {', '.join(weighting_names())})")
        _check_ranges(solve_every=solve_every, warmup_steps=warmup_steps, rho=rho, grad_eps=grad_eps)
        if isinstance(accumulation, bool) or not isinstance(accumulation, (int, np.integer)) \
                or accumulation < 1:
            raise ValueError(f"accumulation = {accumulation!r} must be an integer >= 1")
        if gram_space != "parameters":
            raise ValueError(f"gram_space = {gram_space!r}: the library offers 'parameters' only "
                             "('output' needs the model's prediction and loss head: the trainer's)")
        if method == "gramian" and weighting not in weighting_names():
            raise ValueError(f"method 'gramian' needs weighting= one of {', '.join(weighting_names())}, "
                             f"got {weighting!r}")
        if (weighting is not None or weighting_options) and method != "gramian":
            raise ValueError(f"weighting= goes with method 'gramian', not {method!r}")
        if fixed_alphas is not None and method != "equal_alpha":
            raise ValueError(f"fixed_alphas= goes with method 'equal_alpha', not {method!r}")
        if len(set(rewards)) != len(rewards):
            raise ValueError(f"reward names must be distinct, got {list(rewards)}")
        cfg = BalancerConfig(method=method, weighting=weighting,
                             weighting_options=dict(weighting_options or {}),
                             amortize_every=int(solve_every), warmup_steps=int(warmup_steps),
                             alpha_ema=float(rho), grad_eps=float(grad_eps),
                             fixed_alphas=None if fixed_alphas is None else list(fixed_alphas),
                             # Losses handed in are already per-reward means: the exact form
                             # sum_k alpha_k L_k (the combined advantage needs the advantages).
                             exact_masking=True, diagnostics_every=0,
                             cached_weights=cached_weights, zoo_gradients=zoo_gradients,
                             fresh=fresh)
        problem = _options_problem(cfg)
        if problem:
            raise ValueError(problem)
        # The trainer's own strategy object decides the schedule and keeps its state.
        self._strategy = build_balancer(cfg, list(rewards))
        self.rewards = list(rewards)
        self.method = method
        self.grad_eps = float(grad_eps)
        self.reward_weights = self._reward_weights(reward_weights)
        self.accumulation = int(accumulation)
        self.steps = 0  # calls so far (micro-steps): step // accumulation is the optimizer step

    def _reward_weights(self, weights: Sequence[float] | None) -> np.ndarray:
        k = len(self.rewards)
        w = np.ones(k) if weights is None else np.asarray(weights, dtype=np.float64)
        if w.shape != (k,) or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
            raise ValueError(f"reward_weights must be {k} finite values >= 0, not all 0, got {weights}")
        return w

    # ------------------------------------------------------------------ the two calls

    def step(self, losses: Mapping[str, Optional[torch.Tensor]], params: Iterable[torch.Tensor], *,
             backward: bool = True) -> Balanced:
        """Balance the scalar `losses` (reward -> loss; missing, None or NaN: absent) over
        `params`: with `backward`, add the balanced gradient to each parameter's .grad (step
        your optimizer after); without, return it as `loss` to backpropagate yourself (its
        gradient is the same direction). A solve costs one gradient pass per present reward
        (the graph is retained for them); telling a NaN loss from a finite one reads each loss
        back to the host once."""
        params = _distinct([p for p in params if p.requires_grad])
        present = self._aligned(losses, "losses", _is_present_loss)
        if all(loss is None for loss in present):
            raise ValueError(f"Balancer.step: no reward's loss is present (missing, None or not "
                             f"finite: {sorted(losses)}); nothing to balance, no step counted")
        solved = self._solves_now()
        direction = None
        if solved:
            local = [flat_grad(loss, params) if loss is not None else flat_zeros(params)
                     for loss in present]
            direction, alpha, coef = self._solve(local, refuse_nonfinite=True)
        else:
            alpha = coef = self._amortized_weights([loss is not None for loss in present])
        terms = [float(c) * loss for c, loss in zip(coef, present) if loss is not None and c != 0]
        total = sum(terms[1:], terms[0]) if terms else torch.zeros((), device=params[0].device)
        if backward:
            if direction is not None:  # the solve's direction as computed: no extra backward pass
                add_into_grads(params, direction)
            elif total.requires_grad:
                _add_finite_grad(total, params)
            total = total.detach()
        return self._finish(alpha, coef, solved, loss=total)

    def combine(self, grads: Mapping[str, Optional[torch.Tensor]]) -> Balanced:
        """Balance per-reward gradients (reward -> tensor, all of one shape, e.g. flattened
        parameters; missing, None or any non-finite entry: absent) and return the combined
        direction in that shape, `direction`. Nothing is backpropagated."""
        given = self._aligned(grads, "grads", _is_gradient)
        shapes = {tuple(g.shape) for g in given if g is not None}
        if len(shapes) > 1:
            raise ValueError(f"Balancer.combine: gradients of different shapes {sorted(shapes)}")
        if not shapes:
            raise ValueError("Balancer.combine: no gradient given (the shape of the direction is unknown)")
        like = next(g for g in given if g is not None)
        present = [g is not None and bool(torch.isfinite(g).all()) for g in given]
        # Copies: the solve zeroes and reduces its vectors in place, the caller's stay untouched.
        flat = [g.detach().flatten().to(torch.float32, copy=True) if ok
                else torch.zeros(like.numel(), device=like.device) for g, ok in zip(given, present)]
        solved = self._solves_now()
        if solved:
            direction, alpha, coef = self._solve(flat)
        else:
            alpha = coef = self._amortized_weights(present)
            direction = torch.zeros_like(flat[0])
            for c, g in zip(coef, flat):
                if c != 0:
                    direction.add_(g, alpha=float(c))
        return self._finish(alpha, coef, solved, direction=direction.reshape(like.shape).to(like.dtype))

    # ------------------------------------------------------------------ state

    @property
    def cached_weights(self) -> dict[str, float] | None:
        """The EMA-smoothed alpha the amortized steps apply (marble, gramian); None before
        the first solve and for the balancers that keep none."""
        cache = self._strategy.alpha_cache
        return None if cache is None else dict(zip(self.rewards, map(float, cache)))

    def state_dict(self) -> dict:
        """The schedule state (step, alpha cache, step of the last solve, torchjd state) as
        plain numbers: save it with your checkpoint."""
        return {"format": STATE_FORMAT, "steps": self.steps, "balancer": self._strategy.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from `state_dict()`; a state of other rewards is an error, another method's
        cache is discarded (as the trainer does on resume)."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"balancer state format {state.get('format')!r}: expected {STATE_FORMAT!r}")
        steps = state.get("steps")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"balancer state: steps {steps!r} must be an integer >= 0")
        self._strategy.load_state_dict(dict(state["balancer"]))
        self.steps = steps

    # ------------------------------------------------------------------ internals

    def _aligned(self, given: Mapping[str, Any], what: str, present) -> list:
        if not isinstance(given, Mapping):
            raise TypeError(f"{what} must be a dict reward name -> {what[:-1]}, got "
                            f"{type(given).__name__} (rewards: {self.rewards})")
        unknown = sorted(set(given) - set(self.rewards))
        if unknown:
            raise ValueError(f"{what} for unknown rewards {unknown}: this balancer has {self.rewards}")
        return [given.get(name) if present(given.get(name)) else None for name in self.rewards]

    def _schedule_step(self) -> SimpleNamespace:
        # What the strategies read of a micro-step for the schedule (as marble.balancers.cadence):
        # the trainer's optimizer step and micro-step, from the calls so far.
        return SimpleNamespace(global_step=self.steps // self.accumulation,
                               micro_index=self.steps % self.accumulation)

    def _solves_now(self) -> bool:
        return bool(self._strategy.wants_full_solve(self._schedule_step()))

    def _solve(self, local: list[torch.Tensor], refuse_nonfinite: bool = False):
        """The trainer's full solve on flat per-reward gradients: (direction, alpha, coefficients)."""
        grads, gram, _, _, nonfinite = reduce_reward_grads(local, self.grad_eps)
        if refuse_nonfinite and int(nonfinite):  # the trainer zeroes, counts and skips the step
            raise FloatingPointError(f"Balancer.step: {int(nonfinite)} non-finite gradient entries "
                                     "from finite losses; .grad not modified")
        at = self._schedule_step()
        strategy = self._strategy
        solved = combine(grads, gram, self.grad_eps, strategy.solver(at))
        _, alpha, failed, norms, valid = solved
        direction = strategy._applied_direction(grads, solved)  # fresh: exact with its EMA
        strategy.solver_fallbacks += int(failed)
        strategy.solve_norms = norms  # cached_weights: norm_corrected caches them
        strategy.solved(at, alpha, valid, {})
        applied = np.where(valid, alpha if direction is solved[0] else strategy.alpha_cache, 0.0)
        raw = getattr(strategy.solver(at), "gradients", "unit") == "raw"
        # d = sum_k alpha_k |g|_mean / |g_k| g_k (solve.combine's direction; raw: alpha_k)
        coef = applied if raw or not valid.any() else \
            unit_form_weights(applied, norms, norms[valid].mean())
        return direction, alpha, coef

    def _amortized_weights(self, present: list[bool]) -> np.ndarray:
        mask = np.asarray(present, dtype=np.float64)
        alpha = self._strategy.applied_alpha()
        if alpha is not None and hasattr(self._strategy, "corrected_weights"):
            alpha = self._strategy.corrected_weights()  # norm_corrected: the solve's unit form
        if alpha is None:  # the weighted sum: a weighted mean over the rewards present
            w = self.reward_weights * mask
            return w / w.sum() if w.sum() > 0 else w
        return np.asarray(alpha, dtype=np.float64) * mask

    def _finish(self, alpha, coef, solved: bool, **out) -> Balanced:
        at = self._schedule_step()
        self.steps += 1
        return Balanced(weights=dict(zip(self.rewards, map(float, alpha))),
                        coefficients=dict(zip(self.rewards, map(float, coef))),
                        solved=solved, step=at.global_step, micro_index=at.micro_index, **out)


def _check_ranges(**values) -> None:
    """The options' ranges are their config keys' (marble/config_ranges.py); steps are integers."""
    for arg, value in values.items():
        rule = RANGES[_RANGED[arg]]
        integer = arg in ("solve_every", "warmup_steps")
        if isinstance(value, bool) or not isinstance(value, (int, np.integer) if integer else (int, float)):
            raise ValueError(f"{arg} = {value!r} must be {'an integer' if integer else 'a number'}")
        if not np.isfinite(value) or not rule.ok(value):
            raise ValueError(f"{arg} = {value!r} must be {rule.text}")


def _options_problem(cfg: BalancerConfig) -> str | None:
    """The config's pairing rules for the options (marble.config), as one-line errors."""
    problem = fresh_balance_problem(cfg)
    return None if problem is None else problem.replace("`balancer.", "`")


def _distinct(params: list) -> list:
    if not params:
        raise ValueError("Balancer.step: no parameter requires grad")
    if len({id(p) for p in params}) != len(params):  # its gradient would be added twice
        raise ValueError("Balancer.step: a parameter is passed twice (e.g. a tied weight listed "
                         "under two names); pass each once")
    return params


def _add_finite_grad(total: torch.Tensor, params: list) -> None:
    """.grad += d total / d params, refused (nothing added) if any entry is not finite: a
    finite loss with a NaN or inf gradient would otherwise reach the optimizer silently."""
    grads = torch.autograd.grad(total, params, allow_unused=True)
    bad = sum(int((~torch.isfinite(g)).sum()) for g in grads if g is not None)
    if bad:
        raise FloatingPointError(f"Balancer.step: {bad} non-finite gradient entries from a finite "
                                 "loss; .grad not modified")
    for p, g in zip(params, grads):
        if g is not None:
            p.grad = g.to(p.dtype).clone() if p.grad is None else p.grad.add_(g)


def _is_present_loss(loss) -> bool:
    if loss is None:
        return False
    if not torch.is_tensor(loss) or loss.dim() != 0:
        raise ValueError(f"a loss must be a scalar tensor, got {type(loss).__name__} "
                         f"{tuple(getattr(loss, 'shape', ()))}")
    if not bool(torch.isfinite(loss.detach())):
        return False
    if loss.grad_fn is None and not loss.requires_grad:
        raise ValueError("a finite loss has no grad_fn: it does not depend on the parameters "
                         "(computed under torch.no_grad() or detached?); pass None for an absent reward")
    return True


def _is_gradient(grad) -> bool:
    if grad is None:
        return False
    if isinstance(grad, (list, tuple)):
        raise TypeError("a gradient must be one tensor; per-parameter lists go flattened: "
                        "torch.cat([g.flatten() for g in grads])")
    if not torch.is_tensor(grad):
        raise TypeError(f"a gradient must be a tensor, got {type(grad).__name__}")
    return True
