"""`balancer.method: gramian`: any torchjd Gramian weighting on MARBLE's Gram matrix and schedule.

A full solve is MARBLE's (marble/balancers/solve.py): per-reward gradients, all-reduced,
rewards absent from the micro-batch (or with a zero gradient) left out, the Gram matrix of
the valid unit gradients, the direction sum_k w_k g^_k rescaled by the mean norm, the KL
gradient outside. Only the weights differ: `balancer.weighting` names a torchjd weighting
(marble/balancers/weightings.py) that computes w from that Gramian instead of the min-norm
QP. The schedule is `Marble`'s, inherited unchanged: solves during warm-up and every
`amortize_every` steps, the EMA (rho = `alpha_ema`) of w cached and applied in between as
sum_k w_k L_k with one backward. torchjd is optional (the `zoo` extra: `INSTALL_HINT`, which
keeps the site's torch); nothing it computes is re-implemented here.

Weights off the simplex: the amortized objective sum_k w_k L_k is exact for any w with
masked L_k (`exact_masking: true`); the reference's combined advantage (`false`) is only
defined for simplex weights, so the methods with weights off it refuse that mode.
"""

from __future__ import annotations

import importlib
import warnings
from functools import partial
from typing import Sequence

import numpy as np
import torch

from marble.balancers.common import MicroStep, reward_loss
from marble.balancers.strategies import Marble
from marble.balancers.weightings import WEIGHTINGS, unknown_weighting
from marble.config import BalancerConfig, ConfigError
from marble.runtime import install
from marble.runtime.seeds import stable_seed

__all__ = ["Gramian", "INSTALL_HINT", "gram_factor", "load_torchjd"]

INSTALL_HINT = install.extra("zoo")


def load_torchjd():
    """torchjd.aggregation, or one line naming the install."""
    try:
        return importlib.import_module("torchjd.aggregation")
    except ImportError as exc:
        raise ConfigError(f"balancer.method = gramian needs torchjd ({exc.name} is missing): "
                          f"{INSTALL_HINT}") from None


def gram_factor(gram: torch.Tensor) -> torch.Tensor:
    """F [K, K] with F F^T = gram (symmetric eigendecomposition, negative round-off
    eigenvalues clipped): the rows are K vectors with exactly these inner products, what
    torchjd's Matrix weightings (Nash-MTL, random) read in place of the gradients."""
    evals, evecs = torch.linalg.eigh(gram)
    return evecs * evals.clamp(min=0).sqrt()


class Gramian(Marble):
    """MARBLE's schedule and full solve with a torchjd weighting in place of the QP."""

    method = "gramian"

    @property
    def min_norm_tol(self) -> float | None:
        """The weighting's own (WeightingSpec.min_norm_tol): torchjd's Frank-Wolfe MGDA at its
        looser tolerance; the other weightings are not min-norm."""
        return self.spec.min_norm_tol

    def __init__(self, cfg: BalancerConfig, reward_names: Sequence[str], weights=None,
                 seed: int = 0):
        super().__init__(cfg, reward_names, weights, seed)
        problem = unknown_weighting(cfg.weighting)
        if problem:
            raise ConfigError(problem)
        self.spec = WEIGHTINGS[cfg.weighting]
        self.cache_on_simplex = self.spec.simplex  # UPGrad's, PCGrad's, ... EMA is not
        if not cfg.exact_masking and not self.spec.simplex:
            raise ConfigError(
                f"balancer.weighting = {cfg.weighting}: its weights are not on the simplex, and "
                "the reference's combined advantage (balancer.exact_masking: false) is only "
                "sum_k w_k L_k for simplex weights: set balancer.exact_masking: true")
        self._module = load_torchjd()
        self.options = {**self.spec.options, **dict(cfg.weighting_options)}
        # One torchjd object per set of rewards present: a stateful weighting (Nash-MTL)
        # keeps one state per set, as it would if only those rewards existed.
        self._weightings: dict[tuple, object] = {}
        self._pending: dict[str, list] = {}  # states loaded before their object exists
        self._make(tuple(range(len(self.reward_names))))  # bad options fail here, early

    def _make(self, idx: tuple):
        if idx not in self._weightings:
            cls = getattr(self._module, self.spec.torchjd_class)
            try:
                made = cls(n_tasks=len(idx), **self.options) if self.spec.aggregator \
                    else cls(**self.options)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"balancer.weighting_options {self.options} for "
                                  f"{self.spec.torchjd_class}: {exc}") from None
            weighting = made.weighting if self.spec.aggregator else made
            state = self._pending.pop(_key(idx), None)
            if state is not None:
                weighting.prvs_alpha = np.asarray(state, dtype=np.float64)
            self._weightings[idx] = weighting
        return self._weightings[idx]

    def solver(self, step: MicroStep):
        solve = partial(self.solve_weights, step)
        # `zoo_gradients: raw`: the weighting reads the raw Gram, as its authors published it;
        # the cached w then applies as sum_k w_k L_k, the same raw form (solve.combine).
        solve.gradients = self.cfg.zoo_gradients
        return solve

    def solve_weights(self, step: MicroStep, gram: np.ndarray, rewards: tuple) -> np.ndarray:
        """torchjd's weights for the valid rewards `rewards` (the Gramian's rows; of the unit
        or the raw gradients, `balancer.zoo_gradients`)."""
        n_rows = len(gram)
        gram = torch.as_tensor(gram, dtype=torch.float64)
        stat = gram_factor(gram) if self.spec.reads == "matrix" else gram
        # PCGrad's order and random weighting draw from torch's global generator: a seed of
        # the run (train.seed: each seed its own draws) and the step keeps resume bitwise and
        # leaves the trainer's own stream untouched.
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            # cvxpy notes on every Nash-MTL solve that its problem is not DPP (speed only)
            warnings.filterwarnings("ignore", message="You are solving a parameterized problem")
            torch.manual_seed(stable_seed("gramian", self.cfg.weighting, self.seed,
                                          int(step.global_step), int(step.micro_index)))
            w = self._make(tuple(rewards))(stat)
        w = np.asarray(w.detach().to(torch.float64).cpu().numpy(), dtype=np.float64)
        if w.shape != (n_rows,) or not np.isfinite(w).all():
            raise RuntimeError(f"{self.spec.torchjd_class} returned weights {w}")
        return w

    def policy_loss(self, step: MicroStep) -> torch.Tensor:
        alpha = self.applied_alpha()
        if alpha is None or bool((alpha >= 0).all()):
            return super().policy_loss(step)
        # Signed weights (IMTL-G, Aligned-MTL can give them): amortized_coefficients folds
        # alpha into per-sample weights that must be positive, so sum_k w_k L_k is K
        # evaluations of the loss head on the one forward: still one backward.
        return sum(float(a) * reward_loss(step, k) for k, a in enumerate(alpha) if a != 0)

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["weighting"] = self.cfg.weighting
        kept = {_key(idx): [float(x) for x in w.prvs_alpha]
                for idx, w in self._weightings.items() if hasattr(w, "prvs_alpha")}
        state["weighting_state"] = {**self._pending, **kept}
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if state.get("weighting") != self.cfg.weighting:  # another weighting's cache
            self.alpha_cache, self.last_full, self.last_alpha = None, None, None
            return
        self._weightings.clear()
        self._pending = {k: list(v) for k, v in (state.get("weighting_state") or {}).items()}


def _key(idx: tuple) -> str:
    return ",".join(str(i) for i in idx)
