"""One descriptor per balancer: what the config, the cost model and the report know about a
`balancer.method`, in one frozen object. Torch-free and in the configuration layer, so the
typed config validates a method against it; the strategy class that runs the method lives in
marble/balancers/ and is registered with its descriptor by `marble.balancers.register`
(docs/ARCHITECTURE.md, "Add a balancer").
"""

from __future__ import annotations

from dataclasses import dataclass

# What a plain (not full-solve, not diagnostic) micro-step of a method costs, as the row of
# `marble bench flops` that prices it (marble.balancers.cadence.kind_row):
CADENCES = (
    "weighted_sum",  # one backward of the weighted sum: the `weighted_sum` row
    "amortized",  # one backward of cached alpha_k L_k: the `marble` row (full solves: `mgda`)
    "zoo",  # a torchjd weighting's amortized step: `zoo_<weighting>` rows of its own
    "advantage",  # the weighted sum's step on another advantage: a row named after the method
)


@dataclass(frozen=True)
class BalancerDescriptor:
    """A balancer method: its name, its cost per micro-step, its report label and style."""

    method: str
    cadence: str  # one of CADENCES
    label: str  # its name in the report's tables, figures and the claim
    style: str = "-"  # matplotlib line style of its curves
    color: str = "tab:gray"  # its colour in every report figure (a new method: grey until it picks one)
    cached: bool = False  # a solve every `amortize_every` steps, EMA'd weights applied between
    # How far below 0 a full solve's worst cosine may sit: its weights are the exact min-norm
    # QP's, so the full-solve theorem applies up to this rounding; None: no min-norm solve.
    min_norm_tol: float | None = None

    def __post_init__(self):
        if self.cadence not in CADENCES:
            raise ValueError(f"balancer {self.method!r}: cadence {self.cadence!r} is not one of {CADENCES}")


BALANCERS: dict[str, BalancerDescriptor] = {}


def register_descriptor(descriptor: BalancerDescriptor) -> BalancerDescriptor:
    """Add a method's descriptor (marble.balancers.register also binds its strategy class)."""
    if descriptor.method in BALANCERS and BALANCERS[descriptor.method] != descriptor:
        raise ValueError(f"balancer {descriptor.method!r} is already registered")
    BALANCERS[descriptor.method] = descriptor
    return descriptor


def balancer_descriptor(method: str) -> BalancerDescriptor:
    """The descriptor of `method`; an unknown one is a KeyError naming the registered ones
    (never priced or labelled as another)."""
    if method not in BALANCERS:
        raise KeyError(f"unknown balancer {method!r} (registered: {', '.join(BALANCERS)})")
    return BALANCERS[method]


for _descriptor in (
    # MARBLE red and the weighted sum blue in every figure; the rest tab10's other colours, none shared.
    BalancerDescriptor("weighted_sum", "weighted_sum", "weighted sum (DiffusionNFT)", style="--", color="tab:blue"),
    BalancerDescriptor("equal_alpha", "amortized", "equal alpha", style=":", color="tab:green"),
    BalancerDescriptor("mgda", "amortized", "MGDA (a full solve every micro-step)", style="-.", min_norm_tol=1e-6,
                       color="tab:purple"),
    BalancerDescriptor("marble", "amortized", "MARBLE", cached=True, min_norm_tol=1e-6, color="tab:red"),
    BalancerDescriptor("gramian", "zoo", "MARBLE schedule, torchjd weighting", style="-", cached=True,
                       color="tab:orange"),
    BalancerDescriptor("gdpo", "advantage", "GDPO (advantage level)", style="--", color="tab:brown"),
    BalancerDescriptor("reward_sum", "advantage", "reward sum (advantage level)", style=":", color="tab:pink"),
):
    register_descriptor(_descriptor)
