"""Multi-reward gradient balancers behind one interface (spec D.3-D.9).

- `weighted_sum`: the DiffusionNFT baseline, one advantage from the NaN-aware mean reward.
- `equal_alpha`: fixed alpha (1/K by default), per-reward advantages, one backward.
- `mgda`: a full solve on every micro-step (K backward passes on one forward).
- `marble`: full solves during warm-up and every `amortize_every` optimizer steps; the
  EMA-smoothed alpha is cached and used with one backward in between.

A "full solve" (spec D.4): per-reward gradients g_k of the masked losses L_k (LoRA parameters
only, all-reduced), unit-normalised, min-norm QP on their Gram matrix, d = sum alpha_k g^_k
rescaled by the mean norm; the KL gradient is added outside the QP.
The amortized step backpropagates scale * (sum_k alpha_k L_k + KL) with masked L_k
(`exact_masking=True`), or the reference's combined advantage (`exact_masking=False`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from marble.advantages import combine_advantages
from marble.balance import min_norm_weights
from marble.config import BalancerConfig
from marble.ema import update_alpha_cache
from marble.nft import optimality_prob

__all__ = ["MicroStep", "Balancer", "build_balancer", "METHODS"]

METHODS = ("weighted_sum", "equal_alpha", "mgda", "marble")
_CHUNK = 1 << 20  # float64 dot products in chunks: no full float64 copy of a gradient


@dataclass
class MicroStep:
    loss_per_sample: Callable[[torch.Tensor], torch.Tensor]  # r [B] -> NFT policy loss [B]
    kl: torch.Tensor  # scalar, already multiplied by lambda_KL
    advantages: torch.Tensor  # [B, K], NaN = reward not applicable
    avg_advantage: torch.Tensor  # [B], advantage of the NaN-aware mean reward
    scale: float  # 1 / (G * T_train)
    params: list  # trainable LoRA parameters only
    global_step: int
    micro_index: int  # 0 for the first micro-step of an optimizer step
    adv_clip: float = 5.0
    # fp16: the run's torch.amp.GradScaler. Every backward goes through scaler.scale(...),
    # so .grad holds scaled gradients for unscale_; per-reward gradients of full solves
    # are unscaled before the QP and the result scaled back (reference train.py).
    grad_scaler: Any = None


# ------------------------------------------------------------------ vector helpers


def _all_reduce_mean(vec: torch.Tensor) -> torch.Tensor:
    """Mean over ranks when torch.distributed runs with world > 1; identity otherwise."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        vec = vec.clone()
        dist.all_reduce(vec, op=dist.ReduceOp.SUM)
        vec /= dist.get_world_size()
    return vec


def _flat_grad(loss: torch.Tensor, params: list) -> torch.Tensor:
    """Gradient of `loss` w.r.t. params as one float32 vector; the graph is kept."""
    if not loss.requires_grad:
        return torch.cat([torch.zeros(p.numel(), device=p.device) for p in params])
    grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    return torch.cat([
        (g if g is not None else torch.zeros_like(p)).reshape(-1).float()
        for g, p in zip(grads, params)
    ])


def _scaled(step: MicroStep, loss: torch.Tensor) -> torch.Tensor:
    """`loss` times the GradScaler's factor (the scaler's own `scale`, which also
    initialises it); unchanged without a scaler."""
    return loss if step.grad_scaler is None else step.grad_scaler.scale(loss)


def _loss_scale(step: MicroStep) -> float:
    return 1.0 if step.grad_scaler is None else float(step.grad_scaler.get_scale())


def _unscaled_grad(step: MicroStep, loss: torch.Tensor) -> torch.Tensor:
    """Gradient of `loss` (computed on the scaled loss, so fp16 does not underflow),
    divided back by the scale: the gradient of `loss` itself."""
    grad = _flat_grad(_scaled(step, loss), step.params)
    return grad if step.grad_scaler is None else grad / _loss_scale(step)


def _zero_nonfinite(vec: torch.Tensor) -> tuple[torch.Tensor, int]:
    bad = ~torch.isfinite(vec)
    n_bad = int(bad.sum())
    return (vec.masked_fill(bad, 0.0) if n_bad else vec), n_bad


def _dot64(a: torch.Tensor, b: torch.Tensor) -> float:
    total = 0.0
    for s in range(0, a.numel(), _CHUNK):
        total += float(torch.dot(a[s:s + _CHUNK].double(), b[s:s + _CHUNK].double()))
    return total


def _add_into_grads(params: list, vec: torch.Tensor) -> None:
    offset = 0
    for p in params:
        chunk = vec[offset:offset + p.numel()].view_as(p).to(p.dtype)
        offset += p.numel()
        if p.grad is None:
            p.grad = chunk.clone()
        else:
            p.grad.add_(chunk)


def _cosines(d: torch.Tensor, grads: list, norms: np.ndarray, valid: np.ndarray) -> np.ndarray:
    d_norm = np.sqrt(max(_dot64(d, d), 0.0))
    out = np.full(len(grads), np.nan)
    for k, g in enumerate(grads):
        if valid[k] and d_norm > 0:
            out[k] = _dot64(d, g) / (d_norm * norms[k])
    return out


# ------------------------------------------------------------------ losses


def _masked_mean(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    kept = torch.where(valid, values, torch.zeros_like(values))
    return kept.sum() / valid.sum().clamp(min=1).to(kept.dtype)  # a tensor: no device sync


def reward_losses(step: MicroStep) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """L_k = sum over valid i of loss_i(r_ki) / max(|V_k|, 1) for every reward (spec D.3)."""
    losses, counts = [], []
    for k in range(step.advantages.shape[1]):
        adv = step.advantages[:, k]
        valid = torch.isfinite(adv)
        r = optimality_prob(torch.nan_to_num(adv, nan=0.0), step.adv_clip)
        losses.append(_masked_mean(step.loss_per_sample(r), valid))
        counts.append(valid.sum())
    return losses, counts


def weighted_sum_loss(step: MicroStep) -> torch.Tensor:
    """Baseline loss: the mean-reward advantage, rows with no applicable reward excluded."""
    valid = torch.isfinite(step.avg_advantage)
    r = optimality_prob(torch.nan_to_num(step.avg_advantage, nan=0.0), step.adv_clip)
    return _masked_mean(step.loss_per_sample(r), valid)


# ------------------------------------------------------------------ the balancer


class Balancer:
    """One of METHODS; `backward(step)` accumulates this micro-step's gradient into p.grad."""

    def __init__(self, cfg: BalancerConfig, reward_names: Sequence[str], weights=None):
        if cfg.method not in METHODS:
            raise ValueError(f"balancer.method = {cfg.method!r}: expected one of {METHODS}")
        self.cfg = cfg
        self.method = cfg.method
        self.reward_names = list(reward_names)
        k = len(self.reward_names)
        if k == 0:
            raise ValueError("a balancer needs at least one reward name")
        # Optional per-reward weights on the unit gradients before the QP (reference
        # pareto.weights; off in the release). Not the weighted-sum reward weights.
        self.qp_weights = np.ones(k) if weights is None else np.asarray(weights, np.float64)
        if self.qp_weights.shape != (k,) or np.any(self.qp_weights <= 0):
            raise ValueError(f"weights must be {k} positive numbers, got {weights}")
        fixed = cfg.fixed_alphas
        self.fixed_alpha = np.full(k, 1.0 / k) if fixed is None else np.asarray(fixed, np.float64)
        if self.fixed_alpha.shape != (k,) or abs(self.fixed_alpha.sum() - 1) > 1e-6:
            raise ValueError(f"balancer.fixed_alphas must be {k} values summing to 1, got {fixed}")
        self.alpha_cache: np.ndarray | None = None
        self.last_full: int | None = None
        self.last_alpha: np.ndarray | None = None
        self.solver_fallbacks = 0

    # -------------------------------------------------------------- schedule

    def wants_full_solve(self, step: MicroStep) -> bool:
        """mgda: always; marble: reference rule of spec D.7; the others: never."""
        if self.method == "mgda":
            return True
        if self.method != "marble":
            return False
        if self.alpha_cache is None or self.last_full is None:
            return True
        if step.global_step < self.cfg.warmup_steps:
            return True
        return step.global_step - self.last_full >= self.cfg.amortize_every

    def _wants_diagnostics(self, step: MicroStep) -> bool:
        every = max(int(self.cfg.diagnostics_every), 1)
        return step.micro_index == 0 and step.global_step % every == 0

    def _applied_alpha(self) -> np.ndarray | None:
        if self.method == "weighted_sum":
            return None
        if self.method == "equal_alpha":
            return self.fixed_alpha
        return self.alpha_cache

    # -------------------------------------------------------------- entry point

    def backward(self, step: MicroStep) -> dict[str, float]:
        self._check(step)
        if self.wants_full_solve(step):
            metrics = self._full_solve(step)
            metrics["full_solve"] = 1.0
        else:
            metrics = self._single_backward(step, self._wants_diagnostics(step))
            metrics["full_solve"] = 0.0
        if self.method == "marble" and self.last_full is not None:
            metrics["alpha_staleness"] = float(step.global_step - self.last_full)
        metrics["solver_fallbacks"] = float(self.solver_fallbacks)
        return metrics

    def _check(self, step: MicroStep) -> None:
        adv = step.advantages
        k = len(self.reward_names)
        if adv.dim() != 2 or adv.shape[1] != k:
            raise ValueError(f"MicroStep.advantages must be [B, {k}], got {tuple(adv.shape)}")
        if step.avg_advantage.shape != (adv.shape[0],):
            raise ValueError(
                f"MicroStep.avg_advantage must be [{adv.shape[0]}], "
                f"got {tuple(step.avg_advantage.shape)}"
            )
        if not step.params:
            raise ValueError("MicroStep.params is empty: no trainable parameters")

    # -------------------------------------------------------------- single backward

    def _applied_policy_loss(self, step: MicroStep, alpha) -> tuple[torch.Tensor, dict]:
        if alpha is None:
            return weighted_sum_loss(step), {}
        if not self.cfg.exact_masking:  # reference: r = 1/2 for masked pairs, plain mean
            combined = combine_advantages(step.advantages, alpha)
            r = optimality_prob(combined, step.adv_clip)
            return step.loss_per_sample(r).mean(), {}
        losses, _ = reward_losses(step)
        total = losses[0] * float(alpha[0])
        for a, loss in zip(alpha[1:], losses[1:]):
            total = total + float(a) * loss
        names = self.reward_names
        parts = {f"loss/policy_{n}": float(v.detach()) for n, v in zip(names, losses)}
        return total, parts

    def _single_backward(self, step: MicroStep, diagnostics: bool) -> dict[str, float]:
        alpha = self._applied_alpha()
        policy, metrics = self._applied_policy_loss(step, alpha)
        kl = torch.as_tensor(step.kl)
        metrics.update({"loss/policy": float(policy.detach()), "loss/kl": float(kl.detach())})
        if alpha is not None:
            metrics.update({f"alpha/{n}": float(a) for n, a in zip(self.reward_names, alpha)})
        if diagnostics:
            applied = _all_reduce_mean(_unscaled_grad(step, step.scale * policy))
            metrics.update(self._diagnostics(step, applied, with_ws=True))
        total = step.scale * (policy + kl)
        torch.autograd.backward(_scaled(step, total), inputs=list(step.params))
        return metrics

    # -------------------------------------------------------------- full solve

    def _reward_gradients(self, step: MicroStep):
        """All-reduced per-reward gradients, their norms and validity, and the losses."""
        losses, counts = reward_losses(step)
        grads, nonfinite = [], 0
        for loss, count in zip(losses, counts):
            local = _unscaled_grad(step, step.scale * loss) if int(count) > 0 else None
            if local is None:
                local = torch.cat([torch.zeros(p.numel(), device=p.device) for p in step.params])
            local, bad = _zero_nonfinite(local)
            g, bad_after = _zero_nonfinite(_all_reduce_mean(local))
            grads.append(g)
            nonfinite += bad + bad_after
        norms = np.array([np.sqrt(max(_dot64(g, g), 0.0)) for g in grads])
        valid = np.isfinite(norms) & (norms > self.cfg.grad_eps)
        return grads, norms, valid, losses, nonfinite

    def _combine(self, grads, norms, valid) -> tuple[torch.Tensor, np.ndarray]:
        """MGDA on unit gradients, rescaled by the mean norm (spec D.4 step 5)."""
        alpha = np.zeros(len(grads))
        idx = [k for k in range(len(grads)) if valid[k]]
        if not idx:
            return torch.zeros_like(grads[0]), alpha
        if len(idx) == 1:
            alpha[idx[0]] = 1.0
            return grads[idx[0]].clone(), alpha
        units = [grads[k] * float(self.qp_weights[k] / norms[k]) for k in idx]
        gram = np.array([[_dot64(u, v) for v in units] for u in units])
        try:
            a = min_norm_weights(gram)
        except (ValueError, RuntimeError, np.linalg.LinAlgError):
            self.solver_fallbacks += 1  # reference: uniform alpha on solver failure
            a = np.full(len(idx), 1.0 / len(idx))
        direction = sum(float(w) * u for w, u in zip(a, units))
        alpha[idx] = a
        return direction * float(norms[idx].mean()), alpha

    def _full_solve(self, step: MicroStep) -> dict[str, float]:
        grads, norms, valid, losses, nonfinite = self._reward_gradients(step)
        kl = torch.as_tensor(step.kl)
        kl_grad, bad = _zero_nonfinite(_all_reduce_mean(_unscaled_grad(step, step.scale * kl)))
        combined, alpha = self._combine(grads, norms, valid)
        values = [float(v.detach()) for v in losses]
        metrics = {f"loss/policy_{n}": v for n, v in zip(self.reward_names, values)}
        metrics["loss/policy"] = float(sum(float(a) * v for a, v in zip(alpha, values)))
        metrics["loss/kl"] = float(kl.detach())
        metrics.update({f"alpha/{n}": float(a) for n, a in zip(self.reward_names, alpha)})
        metrics["valid_rewards"] = float(valid.sum())
        # Entries zeroed above never reach .grad: the trainer reads this count so an
        # overflow still skips the optimizer step (and backs off the GradScaler).
        metrics["nonfinite_grad_entries"] = float(nonfinite + bad)
        # cos(d, g_k) is free here; the weighted-sum direction costs one more backward, so
        # it is measured on the first micro-step of a step (and on scheduled ones) only.
        with_ws = step.micro_index == 0 or self._wants_diagnostics(step)
        metrics.update(self._diagnostics(step, combined, with_ws, (grads, norms, valid)))
        _add_into_grads(step.params, (combined + kl_grad) * _loss_scale(step))
        self.last_alpha = alpha
        if self.method == "marble":
            if valid.any():  # an all-invalid solve has no simplex point to average in
                self.alpha_cache = update_alpha_cache(self.alpha_cache, alpha, self.cfg.alpha_ema)
            self.last_full = step.global_step
            if self.alpha_cache is not None:
                for n, a in zip(self.reward_names, self.alpha_cache):
                    metrics[f"alpha_cache/{n}"] = float(a)
        return metrics

    # -------------------------------------------------------------- diagnostics

    def _diagnostics(self, step, applied, with_ws: bool, reward_grads=None) -> dict:
        """cos(d, g_k) for the applied d and for the weighted-sum d on the same batch (D.9).

        Gradients exclude KL; cosines in float64; a reward with no valid gradient is NaN
        and left out of min/mean/var (population variance).
        """
        grads, norms, valid = reward_grads or self._reward_gradients(step)[:3]
        directions = [("cos", applied)]
        if with_ws:
            ws = applied if self.method == "weighted_sum" else _all_reduce_mean(
                _unscaled_grad(step, step.scale * weighted_sum_loss(step)))
            directions.append(("cos_ws", ws))
        out: dict[str, float] = {}
        for tag, d in directions:
            cos = _cosines(d, grads, norms, valid)
            kept = cos[np.isfinite(cos)]
            for name, c in zip(self.reward_names, cos):
                out[f"{tag}/{name}"] = float(c)
            out[f"{tag}_min"] = float(kept.min()) if kept.size else float("nan")
            out[f"{tag}_mean"] = float(kept.mean()) if kept.size else float("nan")
            out[f"{tag}_var"] = float(kept.var()) if kept.size else float("nan")
            anti = "anti_aligned" + tag[3:]
            out[anti] = float(kept.min() < 0) if kept.size else float("nan")
        for name, n in zip(self.reward_names, norms):
            out[f"grad_norm/{name}"] = float(n)
        return out

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
                f"balancer state is for rewards {names}, this run has {self.reward_names}"
            )
        self.solver_fallbacks = int(state.get("solver_fallbacks", 0))
        if state.get("method") != self.method:
            # Spec D.7: a cache from another method (e.g. equal_alpha) is discarded.
            self.alpha_cache, self.last_full, self.last_alpha = None, None, None
            return
        cache, last = state.get("alpha_cache"), state.get("last_alpha")
        self.alpha_cache = None if cache is None else np.asarray(cache, np.float64)
        self.last_alpha = None if last is None else np.asarray(last, np.float64)
        self.last_full = None if state.get("last_full") is None else int(state["last_full"])


def build_balancer(cfg: BalancerConfig, reward_names: Sequence[str], weights=None) -> Balancer:
    """The balancer named by `cfg.method` for these rewards (see the module docstring)."""
    return Balancer(cfg, reward_names, weights)
