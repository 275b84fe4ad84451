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
from marble.config import BalancerConfig

__all__ = ["MicroStep", "Balancer", "build_balancer", "METHODS", "STRATEGIES", "reward_losses",
           "reward_loss", "weighted_sum_loss", "amortized_loss"]

STRATEGIES = {cls.method: cls for cls in (WeightedSum, EqualAlpha, MGDA, Marble, Gramian, GDPO,
                                          RewardSum)}
METHODS = tuple(STRATEGIES)


def build_balancer(cfg: BalancerConfig, reward_names: Sequence[str], weights=None) -> Balancer:
    """The balancer named by `cfg.method` for these rewards (see the module docstring)."""
    if cfg.method not in STRATEGIES:
        raise ValueError(f"balancer.method = {cfg.method!r}: expected one of {METHODS}")
    # issue 37's named options (cached_weights, gram_space) wrap or replace the method's class
    return fresh_variant(STRATEGIES[cfg.method], cfg)(cfg, reward_names, weights)
