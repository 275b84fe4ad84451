"""Moving averages: weight EMA, the alpha-cache EMA and the old-policy decay (docs/algorithm.md
§5, §7.5)."""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator

import numpy as np
import torch

__all__ = [
    "ema_decay", "WeightEMA", "update_alpha_cache", "old_policy_decay",
]


def ema_decay(step: int, max_decay: float) -> float:
    """Effective weight-EMA decay min((1 + s) / (10 + s), max_decay) (reference ema.py:25-26)."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return min((1.0 + step) / (10.0 + step), float(max_decay))


class WeightEMA:
    """Float32 shadow copies of trainable parameters, updated after each optimizer step."""

    def __init__(self, params: Iterable[torch.nn.Parameter], max_decay: float = 0.9):
        self.params = list(params)
        self.max_decay = float(max_decay)
        self.shadow = [p.detach().to(torch.float32).clone() for p in self.params]

    @torch.no_grad()
    def update(self, step: int) -> float:
        """shadow <- d shadow + (1 - d) param with d = ema_decay(step); returns d.

        `step` is the number of optimizer steps completed, this one included: the
        reference calls its EMA after `global_step += 1` (so d = 2/11 after step 1).
        """
        d = ema_decay(step, self.max_decay)
        for s, p in zip(self.shadow, self.params):
            s.lerp_(p.detach().to(s), 1.0 - d)
        return d

    @torch.no_grad()
    def copy_to(self, params: Iterable[torch.nn.Parameter] | None = None) -> None:
        targets = self.params if params is None else list(params)
        self._check(targets)
        for s, p in zip(self.shadow, targets):
            p.copy_(s.to(p))

    @contextlib.contextmanager
    def swapped(self) -> Iterator[None]:
        """Temporarily put the EMA weights into the live parameters (eval, saving)."""
        backup = [p.detach().clone() for p in self.params]
        self.copy_to()
        try:
            yield
        finally:
            with torch.no_grad():
                for p, b in zip(self.params, backup):
                    p.copy_(b)

    def state_dict(self) -> dict:
        return {"max_decay": self.max_decay, "shadow": [s.clone() for s in self.shadow]}

    def load_state_dict(self, state: dict) -> None:
        shadow = state["shadow"]
        self._check(shadow)
        if not 0.0 <= float(state["max_decay"]) <= 1.0:  # a decay above 1 diverges
            raise ValueError(f"EMA state: max_decay {state['max_decay']} is not in [0, 1]")
        self.max_decay = float(state["max_decay"])
        # Onto the device of the shadow it replaces (a checkpoint is read onto the CPU).
        self.shadow = [s.detach().to(device=own.device, dtype=torch.float32).clone()
                       for s, own in zip(shadow, self.shadow)]

    def _check(self, tensors: list) -> None:
        if len(tensors) != len(self.shadow):
            raise ValueError(f"EMA holds {len(self.shadow)} tensors, got {len(tensors)}")
        for i, (s, t) in enumerate(zip(self.shadow, tensors)):
            if tuple(s.shape) != tuple(t.shape):
                raise ValueError(f"EMA tensor {i}: shape {tuple(s.shape)} != {tuple(t.shape)}")


def update_alpha_cache(cache, alpha_new, rho: float) -> np.ndarray:
    """cache <- rho cache + (1 - rho) alpha_new; the first solve (cache None) stores alpha_new."""
    new = np.asarray(alpha_new, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(new)):
        raise ValueError(f"alpha_new must be finite, got {new}")
    if not 0.0 <= rho <= 1.0:  # before the first-solve return: a bad rho fails on step one
        raise ValueError(f"rho must be in [0, 1], got {rho}")
    if cache is None:
        return new.copy()
    old = np.asarray(cache, dtype=np.float64).reshape(-1)
    if old.shape != new.shape:
        raise ValueError(f"alpha cache has {old.size} entries, alpha_new {new.size}")
    return rho * old + (1.0 - rho) * new


def old_policy_decay(step: int, decay_type: int, cap: float = 0.5) -> float:
    """Decay d of theta_old <- d theta_old + (1 - d) theta (reference return_decay).

    type 0: 0. type 1: min(0.001 s, cap) (the reference caps at 0.5; MARBLE at 0.95).
    type 2: 0 for s < 75, else min(0.0075 (s - 75), 0.999); `cap` does not apply.
    """
    if decay_type == 0:
        return 0.0
    if decay_type == 1:
        return min(0.001 * step, float(cap))
    if decay_type == 2:
        return 0.0 if step < 75 else min(0.0075 * (step - 75), 0.999)
    raise ValueError(f"decay_type must be 0, 1 or 2, got {decay_type}")
