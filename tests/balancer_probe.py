"""A balancer added the documented way (docs/ARCHITECTURE.md, "Add a balancer"): its strategy
class and its descriptor, nothing else. tests/test_add_a_balancer.py registers it and runs the
config, the cost cadence, the claim's table and a tiny training with it."""

from __future__ import annotations

import numpy as np

from marble.balancers.strategies import EqualAlpha
from marble.config_balancers import BalancerDescriptor

METHOD = "probe_first"


class FirstReward(EqualAlpha):
    """All the weight on the first reward, one backward, no solve."""

    method = METHOD

    def __init__(self, cfg, reward_names, weights=None, seed: int = 0):  # Balancer's signature
        super().__init__(cfg, reward_names, weights, seed)
        self.fixed_alpha = np.eye(len(self.reward_names))[0]


DESCRIPTOR = BalancerDescriptor(METHOD, cadence="amortized", label="first reward only", style=":")
