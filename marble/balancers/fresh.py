"""Balancing at one backward's cost (issue 37): two named options on MARBLE's strategies.

- `balancer.cached_weights: norm_corrected` (`NormCorrected`, mixed over `Marble` or the zoo's
  `Gramian`): the schedule, the solves and the alpha EMA are unchanged; the amortized step
  applies w_k = alpha_cache_k n_mean / |g_k| (marble.maths.fresh_balance) instead of
  alpha_cache_k, so it follows the solve's unit-gradient direction in raw-gradient form.
  The norms are those of the last solve (a reward absent from it keeps its last measured
  norm), not refreshed between solves: a fresh |g_k| is a backward per reward, the cost the
  amortization exists to avoid; their drift shows in the diagnostics (`cos` against
  `cos_alpha_unit`, which uses the fresh norms).
- `balancer.gram_space: output` (`OutputGram`): MGDA-UB with the prediction v as the shared
  representation. Every micro-step: u_k = dL_k/dv by backward passes through the loss head
  alone (at a detached copy of v), the K x K Gram all-reduced, the min-norm QP, then the one
  backward of sum_k w_k L_k + KL through the transformer. No cache, no schedule.

Both apply sum_k w_k L_k with one evaluation of the loss head (`weights_loss`).

- `balancer.fresh: exact` (`ExactFresh`, issue 46): a full solve on every micro-step, its K
  reward gradients formed from per-sample gradients (two backward passes for any K).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
import torch

from marble.balancers.common import (
    MicroStep,
    amortized_loss,
    gram64,
    loss_scale,
    reward_loss,
    scaled,
)
from marble.balancers.solve import alpha_combination, gradient_passes, host_gram
from marble.balancers.strategies import Marble
from marble.config import BalancerConfig, ConfigError
from marble.maths.ema import update_alpha_cache
from marble.maths.fresh_balance import (
    affine_coefficients,
    gram_weights,
    output_cosines,
    record_solve_norms,
    split_total,
    unit_form_weights,
)
from marble.runtime.distributed import all_reduce_mean_

__all__ = ["NormCorrected", "OutputGram", "ExactFresh", "weights_loss", "fresh_variant"]


def weights_loss(step: MicroStep, w: np.ndarray, exact_masking: bool) -> torch.Tensor:
    """sum_k w_k L_k for any weights, one evaluation of the loss head when w >= 0: the
    simplex point w / sum w in the combined loss, times sum w (the reference's combined
    advantage is only defined on the simplex). Signed weights: K head evaluations."""
    if np.any(w < 0):
        return sum(float(a) * reward_loss(step, k) for k, a in enumerate(w) if a != 0)
    point, total = split_total(w)
    dev = torch.as_tensor(point, dtype=torch.float64, device=step.advantages.device)
    # total = 0 (no valid reward): a zero loss that keeps the graph, so KL still steps
    return total * amortized_loss(step, dev, exact_masking)


class NormCorrected:
    """Mixin over `Marble` / `Gramian`: the cached alpha applied in the solve's form."""

    def __init__(self, cfg: BalancerConfig, reward_names: Sequence[str], weights=None,
                 seed: int = 0):
        super().__init__(cfg, reward_names, weights, seed)
        self.cached_norms: np.ndarray | None = None  # per reward, NaN = never measured
        self.cached_mean_norm: float | None = None
        self.solve_norms = None  # set by the full solve before `solved`

    def solved(self, step: MicroStep, alpha: np.ndarray, valid: np.ndarray, metrics) -> None:
        super().solved(step, alpha, valid, metrics)
        norms, self.solve_norms = self.solve_norms, None
        if norms is None or not np.asarray(valid).any():  # the cadence walk: no gradients
            return
        self.cached_norms, self.cached_mean_norm = record_solve_norms(self.cached_norms, norms,
                                                                      valid)

    def corrected_weights(self) -> np.ndarray:
        if self.cached_norms is None or self.cached_mean_norm is None:
            raise RuntimeError("cached_weights: norm_corrected has a cached alpha but no norms")
        return unit_form_weights(self.alpha_cache, self.cached_norms, self.cached_mean_norm)

    def policy_loss(self, step: MicroStep) -> torch.Tensor:
        if self.applied_alpha() is None:
            return super().policy_loss(step)
        return weights_loss(step, self.corrected_weights(), self.cfg.exact_masking)

    def step_metrics(self, step: MicroStep, metrics: dict) -> None:
        super().step_metrics(step, metrics)
        if self.cached_norms is not None and self.alpha_cache is not None:
            w = self.corrected_weights()
            metrics.update({f"weight/{n}": float(x) for n, x in zip(self.reward_names, w)})

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["cached_norms"] = None if self.cached_norms is None else \
            [float(x) for x in self.cached_norms]
        state["cached_mean_norm"] = self.cached_mean_norm
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        norms, mean = state.get("cached_norms"), state.get("cached_mean_norm")
        k = len(self.reward_names)
        if norms is not None:
            arr = np.asarray(norms, np.float64)
            if arr.shape != (k,) or np.any(arr[np.isfinite(arr)] < 0) or mean is None \
                    or not np.isfinite(mean) or mean < 0:
                raise ValueError(f"balancer state: cached_norms {norms} / cached_mean_norm {mean} "
                                 f"must be {k} norms >= 0 (NaN = unmeasured) and a mean >= 0")
            self.cached_norms, self.cached_mean_norm = arr, float(mean)
        elif self.alpha_cache is not None:
            # A cache saved without norms (cached_weights: reference): they cannot be
            # inferred, so the next micro-step solves afresh rather than guess them.
            self.cached_norms, self.cached_mean_norm, self.last_full = None, None, None


class OutputGram(Marble):
    """MGDA-UB on the prediction: a fresh output-space solve and one backward every micro-step."""

    # every micro-step's weights are its own output-space solve: `fresh`, not `fixed` (issue 47)
    solves_every_micro_step = True

    def __init__(self, cfg: BalancerConfig, reward_names: Sequence[str], weights=None,
                 seed: int = 0):
        super().__init__(cfg, reward_names, weights, seed)
        self._alpha: np.ndarray | None = None
        self._weights: np.ndarray | None = None

    def wants_full_solve(self, step: MicroStep) -> bool:
        return False

    def applied_alpha(self) -> np.ndarray | None:
        return self._alpha

    def policy_loss(self, step: MicroStep) -> torch.Tensor:
        return weights_loss(step, self._weights, exact_masking=True)

    def backward(self, step: MicroStep) -> dict:
        if step.prediction is None or step.loss_head is None:
            raise ConfigError("balancer.gram_space = output needs MicroStep.prediction and "
                              "MicroStep.loss_head (marble.training.microstep builds them)")
        self._check(step)
        gram = output_gram(step, self._reward_fns(step))
        # The one host read of every micro-step: the K x K Gram, for the QP.
        g = host_gram(gram)
        self._weights, self._alpha, valid, norms, _ = gram_weights(
            g, self.cfg.grad_eps, self.cfg.output_gradients)
        metrics = super().backward(step)
        cos = output_cosines(g, self._weights)
        metrics.update({f"out_cos/{n}": float(c) for n, c in zip(self.reward_names, cos)})
        kept = cos[valid]
        metrics["out_cos_min"] = float(kept.min()) if kept.size else float("nan")
        metrics.update({f"weight/{n}": float(x) for n, x in zip(self.reward_names, self._weights)})
        metrics.update({f"out_grad_norm/{n}": float(x) for n, x in zip(self.reward_names, norms)})
        return metrics


def output_gram(step: MicroStep, present: list) -> torch.Tensor:
    """<dL_k/dv, dL_l/dv> (float64, [K, K], all-reduced mean over ranks): each L_k at a
    detached copy of the prediction, differentiated through the loss head alone. A reward
    absent here (None in `present`) has a zero row. Scale-free: the QP reads directions and
    ratios only, so neither step.scale nor the GradScaler enters."""
    v = step.prediction.detach().requires_grad_(True)
    loss_per_sample, kl = step.loss_head(v)
    view = dataclasses.replace(step, loss_per_sample=loss_per_sample, kl=kl, recompute=None,
                               prediction=None, loss_head=None)
    zeros = torch.zeros(v.numel(), device=v.device)
    rows = []
    for k, fn in enumerate(present):
        if fn is None:
            rows.append(zeros)
            continue
        loss = reward_loss(view, k)
        grad = torch.autograd.grad(loss, v, retain_graph=True, allow_unused=True)[0] \
            if loss.requires_grad else None
        rows.append(zeros if grad is None else torch.nan_to_num(grad.reshape(-1).float(),
                                                                nan=0.0, posinf=0.0, neginf=0.0))
    # Concatenated over ranks the output vector's Gram is the sum of the local ones (up to
    # the common 1/W^2 of the all-reduced mean, which no normalisation reads).
    return all_reduce_mean_(gram64(rows))


class ExactFresh(Marble):
    """`balancer.fresh: exact` (issue 46): MARBLE's full solve on every micro-step, from that
    micro-batch's own reward gradients, which come from per-sample gradients of l+ and l-
    (two backward passes for any K, `marble.balancers.per_sample`) instead of K passes. The
    KL gradient (outside the QP) is its own pass. The K gradients are all-reduced and solved
    exactly as full MGDA's (`Balancer._full_solve`): the same weights, on every rank.

    alpha EMA: `alpha_ema = 0` applies each solve's own direction (no reward opposed: the
    min-norm theorem); `alpha_ema > 0` applies MARBLE's EMA cache in the solve's unit form on
    this micro-batch's gradients, n_mean sum_k cache_k g_k / |g_k| (smoothed, so no longer a
    solve of this micro-batch: the diagnostics measure what that costs)."""

    needs_per_sample = True  # run_micro_step records the v_theta forward's layer inputs

    def wants_full_solve(self, step: MicroStep) -> bool:
        return True

    def _solve_passes(self, step: MicroStep, reward_fns: list, extra: list):
        if step.per_sample is None:
            raise ConfigError("balancer.fresh = exact needs MicroStep.per_sample (the recorder "
                              "marble.training.microstep.build_micro_step(per_sample=True) adds)")
        a, b = affine_coefficients(step.advantages, step.adv_clip)
        present = torch.tensor([fn is not None for fn in reward_fns], device=a.device)
        a, b = a * present[:, None], b * present[:, None]
        n = step.advantages.shape[0]
        # l_i(1) and l_i(0): the loss is affine in r, so these two per-sample functions span
        # every reward's loss; rows no reward applies to are left out (they may be non-finite).
        rows = torch.isfinite(step.advantages).any(1)
        ends = [step.loss_per_sample(torch.full((n,), v, device=a.device)) for v in (1.0, 0.0)]
        local = None
        for end, coef in zip(ends, (a, b)):
            loss = torch.where(rows, end, torch.zeros_like(end)).sum()
            with step.per_sample.contracting(coef) as buf:
                if loss.requires_grad:  # the hooks fill buf during this backward
                    torch.autograd.grad(scaled(step, step.scale * loss), step.params,
                                        retain_graph=True, allow_unused=True)
            local = buf if local is None else local.add_(buf)
        if step.grad_scaler is not None:
            local.div_(loss_scale(step))
        with torch.no_grad():
            both = torch.stack([torch.where(rows, e, torch.zeros_like(e)).double() for e in ends])
            values = (a * both[0] + b * both[1]).sum(1)
        grads = list(local.unbind())
        vals = [values[k] if fn is not None else float("nan") for k, fn in enumerate(reward_fns)]
        more, more_values = gradient_passes(step, extra, recompute=False)
        return grads + more, vals + more_values

    def _applied_direction(self, grads, solved: tuple) -> torch.Tensor:
        direction, alpha, _, norms, valid = solved
        if self.cfg.alpha_ema == 0 or not np.asarray(valid).any():
            return direction
        # the cache `solved` will hold after this solve (Marble.solved runs the same update)
        cache = update_alpha_cache(self.alpha_cache, alpha, self.cfg.alpha_ema)
        return alpha_combination(grads, cache, norms, valid, unit=True)


_MIXED: dict[type, type] = {}


def fresh_variant(cls: type, cfg: BalancerConfig) -> type:
    """The class `build_balancer` builds: `cls` itself under the defaults; `OutputGram` for
    `gram_space: output`; `cls` with `NormCorrected` mixed in for `cached_weights:
    norm_corrected` (config.validate has checked the pairings)."""
    if cfg.gram_space == "output":
        return OutputGram
    if cfg.fresh == "exact":
        return ExactFresh
    if cfg.cached_weights == "norm_corrected":
        if cls not in _MIXED:
            _MIXED[cls] = type(f"NormCorrected{cls.__name__}", (NormCorrected, cls),
                               {"__doc__": cls.__doc__})
        return _MIXED[cls]
    return cls
