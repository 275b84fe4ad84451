"""Multi-reward gradient balancers behind one interface (docs/algorithm.md §7).

- `weighted_sum`: the DiffusionNFT baseline, one advantage from the NaN-aware mean reward.
- `equal_alpha`: fixed alpha (1/K by default), per-reward advantages, one backward.
- `mgda`: a full solve on every micro-step (K backward passes).
- `marble`: full solves during warm-up and every `amortize_every` optimizer steps; the
  EMA-smoothed alpha is cached and used with one backward in between.
- `gramian`: `marble` with a torchjd weighting (`balancer.weighting`) in place of the QP
  (marble/balancers/gramian.py; torchjd is the `zoo` extra).
- `gdpo`, `reward_sum`: the weighted sum's step on GDPO's / MixGRPO's advantage
  (marble/balancers/advantage_level.py).
- options beyond the reference (marble/balancers/fresh.py): `cached_weights: norm_corrected`
  (the cached alpha in the solve's unit-gradient form) and `gram_space: output` (MGDA-UB on
  the prediction: a fresh solve every micro-step, one backward).

A "full solve" (docs/algorithm.md §7.2): per-reward gradients g_k of the masked losses L_k (LoRA parameters
only, all-reduced), unit-normalised, min-norm QP on their Gram matrix, d = sum alpha_k g^_k
rescaled by the mean norm; the KL gradient is added outside the QP. `balancer.full_solve`
says whether the K passes share one retained graph (`retain`, the reference) or each
recompute the forward (`recompute`: same gradients, a plain step's peak memory).
The amortized step backpropagates scale * (sum_k alpha_k L_k + KL) as one evaluation of the
loss head (the NFT loss is affine in r): masked L_k (`exact_masking=True`) or the
reference's combined advantage (`exact_masking=False`).
"""

from __future__ import annotations

from typing import Sequence

from marble.balancers.common import (
    MicroStep,
    amortized_loss,
    reward_loss,
    reward_losses,
    weighted_sum_loss,
)
from marble.balancers.advantage_level import GDPO, RewardSum
from marble.balancers.fresh import fresh_variant
from marble.balancers.gramian import Gramian
from marble.balancers.strategies import MGDA, Balancer, EqualAlpha, Marble, WeightedSum
from marble.balancers.weightings import WEIGHTINGS
from marble.config import BalancerConfig
from marble.config_balancers import BALANCERS, BalancerDescriptor, register_descriptor

__all__ = ["MicroStep", "Balancer", "build_balancer", "register", "unregister", "METHODS", "STRATEGIES",
           "reward_losses", "reward_loss", "weighted_sum_loss", "amortized_loss", "min_norm_tolerance"]

STRATEGIES = {cls.method: cls for cls in (WeightedSum, EqualAlpha, MGDA, Marble, Gramian, GDPO,
                                          RewardSum)}


def __getattr__(name: str):
    """`METHODS`: the names in the registry now. Read on each access, not a tuple taken at import,
    so a balancer `register`ed (or `unregister`ed) later is listed (or not) like the built-in ones."""
    if name == "METHODS":
        return tuple(STRATEGIES)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register(descriptor: BalancerDescriptor, strategy: type[Balancer]) -> None:
    """Add a balancer: its descriptor (config validation, cost cadence, report) and the strategy
    class that runs it (docs/ARCHITECTURE.md, "Add a balancer")."""
    if strategy.method != descriptor.method:
        raise ValueError(f"strategy {strategy.__name__}.method {strategy.method!r} is not the "
                         f"descriptor's {descriptor.method!r}")
    register_descriptor(descriptor)
    STRATEGIES[descriptor.method] = strategy


def unregister(method: str) -> None:
    """Remove a balancer (tests that add a toy one take it out again)."""
    STRATEGIES.pop(method, None)
    BALANCERS.pop(method, None)


def build_balancer(cfg: BalancerConfig, reward_names: Sequence[str], weights=None,
                   seed: int = 0) -> Balancer:
    """The balancer named by `cfg.method` for these rewards (see the module docstring);
    `seed`: the run's train.seed (the random draws of a weighting such as `random` key on it)."""
    if cfg.method not in STRATEGIES:
        raise ValueError(f"balancer.method = {cfg.method!r}: expected one of {tuple(STRATEGIES)}")
    # issue 37's named options (cached_weights, gram_space) wrap or replace the method's class
    return fresh_variant(STRATEGIES[cfg.method], cfg)(cfg, reward_names, weights, seed)


def min_norm_tolerance(method: str, weighting: str | None = None) -> float | None:
    """How far below 0 a full solve's worst cosine may sit for the balancer `method`
    (`weighting` for `gramian`): its solve is a min-norm point, so the full-solve theorem
    applies. None: no min-norm solve (weighted sum, UPGrad, ...). The balancer's descriptor's
    (or the torchjd weighting's), not a list of names; nothing is built (no torchjd)."""
    if method not in STRATEGIES:
        raise ValueError(f"balancer.method = {method!r}: expected one of {tuple(STRATEGIES)}")
    if method == Gramian.method:
        spec = WEIGHTINGS.get(weighting or "")
        return None if spec is None else spec.min_norm_tol
    return BALANCERS[method].min_norm_tol  # the descriptor's
