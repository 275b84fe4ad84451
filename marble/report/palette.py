"""How every report figure draws a balancer and a seed: one colour and label per balancer,
one line style per seed. A run's colour follows its balancer, never its position in the
run list, so MARBLE is the same red in every panel and every report.

`balancer_look` is the single place that maps a balancer (`RunData.balancer`, a
`balancer.method`) to its look; a balancer registry can take its place without touching
the figures."""

from __future__ import annotations

from dataclasses import dataclass

# Known balancers, in the order figures list them (the baseline first, MARBLE last): MARBLE
# red and the weighted sum blue; the rest from tab10's remaining colours, none shared.
_KNOWN = {
    "weighted_sum": ("tab:blue", "weighted sum"),
    "equal_alpha": ("tab:green", "equal alpha"),
    "mgda": ("tab:purple", "MGDA (full solve every step)"),
    "gramian": ("tab:orange", "Gramian weighting"),
    "gdpo": ("tab:brown", "GDPO"),
    "reward_sum": ("tab:pink", "reward sum"),
    "sequential": ("tab:olive", "sequential stages"),
    "marble": ("tab:red", "MARBLE"),
}
_OTHER = "tab:gray"  # an unknown balancer (a new method): grey, labelled by its name
SEED_STYLES = ("-", "--", ":", "-.")


@dataclass(frozen=True)
class Look:
    color: str
    label: str


def balancer_look(balancer: str) -> Look:
    """The colour and the legend label of a balancer."""
    if balancer in _KNOWN:
        return Look(*_KNOWN[balancer])
    return Look(_OTHER, balancer.replace("_", " "))


def balancer_order(balancers) -> list[str]:
    """The distinct balancers in figure order: the known ones as listed above, then the rest
    by name."""
    known = list(_KNOWN)
    return sorted(dict.fromkeys(balancers), key=lambda b: (known.index(b), "") if b in known else (len(known), b))


def seed_styles(seeds) -> dict:
    """seed -> line style, in sorted order of the seeds present (None, a seedless run, last)."""
    ordered = sorted({s for s in seeds if s is not None}) + ([None] if None in set(seeds) else [])
    return {s: SEED_STYLES[i % len(SEED_STYLES)] for i, s in enumerate(ordered)}
