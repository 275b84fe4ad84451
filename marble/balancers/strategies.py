"""The four balancers (docs/algorithm.md §7) as small strategies behind one contract.

`Balancer.backward(step)` accumulates one micro-step's gradient into p.grad and returns
its metrics as device scalars or floats, without reading anything back to the host but
the K x K Gram matrix of a full solve (the QP's input); the trainer reads them all once
per optimizer step (`marble.training.metrics.StepAverager`). A strategy only says what
differs: whether this micro-step is a full solve (`wants_full_solve`), which alpha the
single-backward step applies (`applied_alpha`; None = the weighted sum) and what a solve
updates (`solved`). `state_dict` has one format for all four, so checkpoints load across
versions.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from marble.balancers.common import (
    MicroStep,
    add_into_grads,
    amortized_loss,
    flat_grad,
    loss_scale,
    reward_loss,
    scaled,
    weighted_sum_loss,
    zero_nonfinite,
)
from marble.balancers.solve import (
    combine,
    cosine_metrics,
    gradient_passes,
    reduce_reward_grads,
    solve_gap_metrics,
)
from marble.balancers.levels import StepLevels, weight_source
from marble.config import BalancerConfig
from marble.config_balancers import balancer_descriptor
from marble.maths.ema import update_alpha_cache
from marble.runtime.distributed import all_reduce_mean_

__all__ = ["Balancer", "WeightedSum", "EqualAlpha", "MGDA", "Marble"]


def _kl(step: MicroStep) -> torch.Tensor:
    return torch.as_tensor(step.kl)


def schedule_state_problem(cache, last_alpha, last_full, k: int,
                           simplex: bool = True) -> str | None:
    """What is wrong with a saved schedule state, or None. The cache is an EMA of simplex
    points, so it is one (a NaN or a wrong length would be applied as the step's alpha;
    `simplex=False`: a zoo weighting whose weights are off the simplex, finite only);
    `last_full` is the optimizer step of the last solve, >= 0."""
    for key, value in (("alpha_cache", cache), ("last_alpha", last_alpha)):
        if value is not None:
            a = np.asarray(value, np.float64)
            if a.shape != (k,) or not np.all(np.isfinite(a)):
                return f"{key} {value} must be {k} finite values"
    if simplex and cache is not None and (np.min(cache) < -1e-9 or abs(float(np.sum(cache)) - 1.0) > 1e-6):
        return f"alpha_cache {cache} is not on the simplex (>= 0, sum 1)"
    if last_full is not None and (isinstance(last_full, bool) or not isinstance(last_full, int) or last_full < 0):
        return f"last_full {last_full!r} must be an optimizer step >= 0"
    return None


class Balancer:
    """Shared machinery; subclasses are the methods. Use `build_balancer`."""

    method = ""
    cache_on_simplex = True  # the alpha cache is an EMA of simplex points (load checks it)

    @property
    def min_norm_tol(self) -> float | None:
        """The full solve's weights are the min-norm point of the unit gradients' hull (our exact
        QP), so a solve never opposes a reward (docs/algorithm.md §7.2) up to this rounding; None:
        no full solve, or not a min-norm one. The method's descriptor says which."""
        return balancer_descriptor(self.method).min_norm_tol

    def __init__(self, cfg: BalancerConfig, reward_names: Sequence[str], weights=None,
                 seed: int = 0):
        self.cfg = cfg
        self.seed = int(seed)  # the run's train.seed: a weighting that draws keys on it
        self.reward_names = list(reward_names)
        k = len(self.reward_names)
        if k == 0:
            raise ValueError("a balancer needs at least one reward name")
        # The reference's optional per-reward QP weights (pareto.weights) are off in its
        # release and were never used here: refuse any but all-ones rather than ignore them.
        if weights is not None and (len(weights) != k or any(float(w) != 1.0 for w in weights)):
            raise ValueError(f"per-reward QP weights are not supported (got {weights}); "
                             "reward weights of the weighted sum live in `rewards[].weight`")
        self.alpha_cache: np.ndarray | None = None
        self.last_full: int | None = None
        self.last_alpha: np.ndarray | None = None
        self.solver_fallbacks = 0
        self._alpha_src: np.ndarray | None = None  # the array _alpha_dev was copied from
        self._alpha_dev: torch.Tensor | None = None
        # The trainer's three-level record of a diagnostic step (marble/balancers/levels.py);
        # None elsewhere (bench, cadence walks): nothing is accumulated.
        self.levels: StepLevels | None = None

    # -------------------------------------------------------------- strategy hooks

    def wants_full_solve(self, step: MicroStep) -> bool:
        return False

    def applied_alpha(self) -> np.ndarray | None:
        """alpha of the single-backward step; None = the weighted-sum objective."""
        return None

    def solved(self, step: MicroStep, alpha: np.ndarray, valid: np.ndarray, metrics) -> None:
        self.last_alpha = alpha

    def step_metrics(self, step: MicroStep, metrics: dict) -> None:
        pass

    def solver(self, step: MicroStep):
        """What computes a full solve's weights from the Gramian of the valid unit gradients:
        None = the min-norm QP (solve.combine), else `f(unit_gram, rewards) -> weights`."""
        return None

    # -------------------------------------------------------------- the contract

    def backward(self, step: MicroStep) -> dict:
        self._check(step)
        full = self.wants_full_solve(step)
        metrics = self._full_solve(step) if full else self._single_backward(step)
        metrics["full_solve"] = float(full)
        self.step_metrics(step, metrics)
        metrics["solver_fallbacks"] = float(self.solver_fallbacks)
        return metrics

    def policy_loss(self, step: MicroStep) -> torch.Tensor:
        alpha = self.applied_alpha()
        if alpha is None:
            return weighted_sum_loss(step)
        return amortized_loss(step, self._on_device(alpha, step.advantages.device),
                              self.cfg.exact_masking)

    def _on_device(self, alpha: np.ndarray, device) -> torch.Tensor:
        """alpha as a float64 device tensor, copied once per new alpha (a solve or a load
        replaces the array, never mutates it), not once per micro-step."""
        if self._alpha_src is not alpha or self._alpha_dev.device != torch.device(device):
            self._alpha_src = alpha
            self._alpha_dev = torch.as_tensor(alpha, dtype=torch.float64, device=device)
        return self._alpha_dev

    def diagnostic_step(self, global_step: int) -> bool:
        """Whether optimizer step `global_step` runs the diagnostics (every `diagnostics_every`)."""
        every = int(self.cfg.diagnostics_every)  # 0: never
        return every > 0 and global_step % every == 0

    def wants_diagnostics(self, step: MicroStep) -> bool:
        # Every micro-step of a diagnostic step (issue 36): micro-step 0 alone is the solve's
        # own micro-batch under MARBLE, and its cosines are not the step's. `first`: the
        # cheaper micro-step-0 reading, for runs that name it (the paper presets).
        every_micro = self.cfg.diagnostics_micro == "all"
        return self.diagnostic_step(step.global_step) and (every_micro or step.micro_index == 0)

    def measures_levels(self, global_step: int) -> bool:
        """Whether this optimizer step records the three levels (all its micro-steps measured)."""
        return self.diagnostic_step(global_step) and self.cfg.diagnostics_micro == "all"

    def _record_levels(self, step: MicroStep, full: bool, direction, grads, valid, min_cos) -> None:
        """This micro-step's direction, reward gradients and min cosine into the step's levels."""
        if self.levels is None or not self.wants_diagnostics(step):
            return
        self.levels.add_micro(step.micro_index, self.micro_source(full, step.global_step), direction,
                              grads, valid, min_cos)

    # Issue 47 item 6: a balancer that solves on every micro-step outside the parameter-space
    # full solve (OutputGram's output-space QP) sets this, so its micro-steps read `fresh`.
    solves_every_micro_step = False

    def micro_source(self, full: bool, global_step: int) -> str:
        """Where this micro-step's weights came from (levels.WEIGHT_SOURCES)."""
        return weight_source(full or self.solves_every_micro_step, self.last_full, global_step,
                             self.applied_alpha() is not None)

    @property
    def recompute(self) -> bool:
        return self.cfg.full_solve == "recompute"

    def _check(self, step: MicroStep) -> None:
        adv, k = step.advantages, len(self.reward_names)
        if adv.dim() != 2 or adv.shape[1] != k:
            raise ValueError(f"MicroStep.advantages must be [B, {k}], got {tuple(adv.shape)}")
        if step.avg_advantage.shape != (adv.shape[0],):
            raise ValueError(f"MicroStep.avg_advantage must be [{adv.shape[0]}], "
                             f"got {tuple(step.avg_advantage.shape)}")
        if not step.params:
            raise ValueError("MicroStep.params is empty: no trainable parameters")

    def _reward_fns(self, step: MicroStep) -> list:
        """One loss per reward; None (no pass at all) for a reward absent from the batch.
        Presence comes from the host (`MicroStep.reward_present`, no device read) when the
        caller has it; otherwise it is read from the advantages (one host sync)."""
        present = step.reward_present
        if present is None:
            present = (torch.isfinite(step.advantages).sum(0) > 0).tolist()
        return [(lambda s, k=k: reward_loss(s, k)) if p else None
                for k, p in enumerate(present)]

    # -------------------------------------------------------------- single backward

    def _single_backward(self, step: MicroStep) -> dict[str, float]:
        alpha = self.applied_alpha()
        policy, kl = self.policy_loss(step), _kl(step)
        # Device scalars: the trainer reads every metric once, at the optimizer step.
        metrics = {"loss/policy": policy.detach(), "loss/kl": kl.detach()}
        if alpha is not None:
            metrics.update({f"alpha/{n}": float(a) for n, a in zip(self.reward_names, alpha)})
        if not self.wants_diagnostics(step):
            torch.autograd.backward(scaled(step, step.scale * (policy + kl)),
                                    inputs=list(step.params))
            return metrics
        metrics.update(self._diagnostic_backward(step, policy, kl))
        return metrics

    def _diagnostic_backward(self, step: MicroStep, policy, kl) -> dict[str, float]:
        """The training gradient exactly as the plain path computes it (one backward of the
        same loss into p.grad: diagnostics never change the trajectory), then each L_k, the
        weighted sum unless it is the applied one, and KL as separate passes, so cos(d, g_k)
        comes from the same batch (D.9); d = the training gradient minus the KL pass's."""
        k = len(self.reward_names)
        ws_applied = self.applied_alpha() is None
        joint = flat_grad(scaled(step, step.scale * (policy + kl)), step.params, retain=True)
        add_into_grads(step.params, joint)  # what torch.autograd.backward would accumulate
        del policy, kl
        fns = [*self._reward_fns(step)] + ([] if ws_applied else [weighted_sum_loss]) + [_kl]
        local, values = gradient_passes(step, fns, self.recompute)
        if step.grad_scaler is not None:
            joint.div_(loss_scale(step))
        kl_grad = all_reduce_mean_(local[-1])
        applied = all_reduce_mean_(joint).sub_(kl_grad)  # in place: p.grad has its own copy
        grads, gram, norms, valid, _ = reduce_reward_grads(local[:k], self.cfg.grad_eps)
        ws = applied if ws_applied else all_reduce_mean_(local[k])
        out = cosine_metrics(self.reward_names, [("cos", applied), ("cos_ws", ws)],
                             grads, valid)
        # The same gradients under a fresh solve and under the applied alpha (issue 26 item 4).
        out.update(solve_gap_metrics(self.reward_names, applied, grads, gram, self.cfg.grad_eps,
                                     self.applied_alpha(), kl_grad))
        out.update(self._reward_metrics(norms, values[:k]))
        self._record_levels(step, False, applied, grads, valid, out["cos_min"])
        return out

    def _reward_metrics(self, norms, losses) -> dict:
        """grad_norm/* and loss/policy_* (device scalars or floats, read at the step)."""
        out = {f"grad_norm/{n}": v for n, v in zip(self.reward_names, norms)}
        out.update({f"loss/policy_{n}": v for n, v in zip(self.reward_names, losses)})
        return out

    # -------------------------------------------------------------- full solve

    def _full_solve(self, step: MicroStep) -> dict[str, float]:
        """Spec D.4: K per-reward gradients, all-reduced; min-norm QP on the unit gradients;
        rescaled combination + the KL gradient (outside the QP) added into p.grad."""
        k = len(self.reward_names)
        diagnostics = int(self.cfg.diagnostics_every) > 0
        # cos(d, g_k) is free here; the weighted-sum direction costs one more pass, so it is
        # measured on the diagnostics cadence only (every micro-step of every n-th step).
        with_ws = self.wants_diagnostics(step)
        local, values = self._solve_passes(step, self._reward_fns(step),
                                           [_kl] + ([weighted_sum_loss] if with_ws else []))
        grads, gram, _, valid_dev, nonfinite = reduce_reward_grads(local[:k], self.cfg.grad_eps)
        kl_grad, bad = zero_nonfinite(all_reduce_mean_(local[k]))
        # The solve's one host read: the K x K Gram matrix for the QP (solve.host_gram).
        solved = combine(grads, gram, self.cfg.grad_eps, self.solver(step))
        combined, alpha, failed, norms, valid = solved
        combined = self._applied_direction(grads, solved)
        self.solver_fallbacks += int(failed)  # reference: uniform alpha on solver failure
        metrics = self._reward_metrics([float(x) for x in norms], values[:k])
        # float64 as before; a reward with no sample on this rank has a NaN float value (no pass)
        used = [float(a) * (v.double() if torch.is_tensor(v) else float(v))
                for a, v in zip(alpha, values[:k]) if a != 0]
        metrics["loss/policy"] = sum(used) if used else float("nan")
        metrics["loss/kl"] = values[k]
        metrics.update({f"alpha/{n}": float(a) for n, a in zip(self.reward_names, alpha)})
        metrics["valid_rewards"] = float(valid.sum())
        # Entries zeroed above never reach .grad: the trainer reads this count so an
        # overflow still skips the optimizer step (and backs off the GradScaler).
        metrics["nonfinite_grad_entries"] = nonfinite + bad
        if diagnostics:
            dirs = [("cos", combined)]
            if with_ws:
                dirs.append(("cos_ws", all_reduce_mean_(local[k + 1])))
            metrics.update(cosine_metrics(self.reward_names, dirs, grads, valid_dev))
            metrics.update(solve_gap_metrics(self.reward_names, combined, grads, gram,
                                             self.cfg.grad_eps, kl_grad=kl_grad, solved=solved))
            self._record_levels(step, True, combined, grads, valid_dev, metrics["cos_min"])
        del local, grads
        add_into_grads(step.params, combined.add_(kl_grad).mul_(loss_scale(step)))
        self.solve_norms = norms  # host norms of this solve (cached_weights: norm_corrected)
        self.solved(step, alpha, valid, metrics)
        return metrics

    def _solve_passes(self, step: MicroStep, reward_fns: list, extra: list):
        """A full solve's local gradients and loss values: the K rewards' (None = absent),
        then those of `extra` (KL, the weighted sum on diagnostic micro-steps). One backward
        per loss (`gradient_passes`); `balancer.fresh: exact` forms the K from two."""
        return gradient_passes(step, [*reward_fns, *extra], self.recompute)

    def _applied_direction(self, grads, solved: tuple) -> torch.Tensor:
        """The policy direction a full solve applies: the solve's own (`combine`'s)."""
        return solved[0]

    # -------------------------------------------------------------- state

    def state_dict(self) -> dict:
        def as_list(a):
            return None if a is None else [float(x) for x in a]

        return {
            "method": self.method, "reward_names": list(self.reward_names),
            "alpha_cache": as_list(self.alpha_cache), "last_full": self.last_full,
            "last_alpha": as_list(self.last_alpha), "solver_fallbacks": self.solver_fallbacks,
        }

    def load_state_dict(self, state: dict) -> None:
        names = list(state.get("reward_names", []))
        if names != self.reward_names:
            raise ValueError(
                f"balancer state is for rewards {names}, this run has {self.reward_names}")
        self.solver_fallbacks = int(state.get("solver_fallbacks", 0))
        if state.get("method") != self.method:
            # Spec D.7: a cache from another method (e.g. equal_alpha) is discarded.
            self.alpha_cache, self.last_full, self.last_alpha = None, None, None
            return
        cache, last = state.get("alpha_cache"), state.get("last_alpha")
        problem = schedule_state_problem(cache, last, state.get("last_full"), len(self.reward_names),
                                         self.cache_on_simplex)
        if problem:
            raise ValueError(f"balancer state: {problem}")
        self.alpha_cache = None if cache is None else np.asarray(cache, np.float64)
        self.last_alpha = None if last is None else np.asarray(last, np.float64)
        self.last_full = None if state.get("last_full") is None else int(state["last_full"])


class WeightedSum(Balancer):
    """The DiffusionNFT baseline: one advantage from the NaN-aware mean reward."""

    method = "weighted_sum"


class EqualAlpha(Balancer):
    """Fixed alpha (1/K by default) on the per-reward advantages, one backward, no solve."""

    method = "equal_alpha"

    def __init__(self, cfg: BalancerConfig, reward_names: Sequence[str], weights=None,
                 seed: int = 0):
        super().__init__(cfg, reward_names, weights, seed)
        k, fixed = len(self.reward_names), cfg.fixed_alphas
        self.fixed_alpha = np.full(k, 1.0 / k) if fixed is None else np.asarray(fixed, np.float64)
        if self.fixed_alpha.shape != (k,) or abs(self.fixed_alpha.sum() - 1) > 1e-6:
            raise ValueError(f"balancer.fixed_alphas must be {k} values summing to 1, got {fixed}")

    def applied_alpha(self) -> np.ndarray:
        return self.fixed_alpha


class MGDA(Balancer):
    """A full solve on every micro-step."""

    method = "mgda"

    def wants_full_solve(self, step: MicroStep) -> bool:
        return True


class Marble(Balancer):
    """Full solves during warm-up and every `amortize_every` optimizer steps; the EMA of
    their alpha is applied with one backward in between (docs/algorithm.md §7.5)."""

    method = "marble"

    def wants_full_solve(self, step: MicroStep) -> bool:
        if self.alpha_cache is None or self.last_full is None:
            return True
        if step.global_step < self.cfg.warmup_steps:
            return True
        return step.global_step - self.last_full >= self.cfg.amortize_every

    def applied_alpha(self) -> np.ndarray | None:
        return self.alpha_cache

    def solved(self, step: MicroStep, alpha: np.ndarray, valid: np.ndarray, metrics) -> None:
        super().solved(step, alpha, valid, metrics)
        if valid.any():  # an all-invalid solve has no simplex point to average in
            self.alpha_cache = update_alpha_cache(self.alpha_cache, alpha, self.cfg.alpha_ema)
        self.last_full = step.global_step
        if self.alpha_cache is not None:
            metrics.update({f"alpha_cache/{n}": float(a)
                            for n, a in zip(self.reward_names, self.alpha_cache)})

    def step_metrics(self, step: MicroStep, metrics: dict) -> None:
        if self.last_full is not None:
            metrics["alpha_staleness"] = float(step.global_step - self.last_full)
