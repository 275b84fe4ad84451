"""How every report figure draws a balancer and a seed: one colour and label per balancer,
one line style per seed. A run's colour follows its balancer, never its position in the
run list, so MARBLE is the same red in every panel and every report.

The colour and the label are the balancer's descriptor's (marble.config_balancers): a
balancer registered with `marble.balancers.register` is drawn without touching this file."""

from __future__ import annotations

from dataclasses import dataclass

from marble.config_balancers import BALANCERS
from marble.config_stages import STAGED_KIND, STAGED_LOOK

# Table 1's staged row is a run kind, not a balancer method: its look is config_stages'.
_STAGED = {STAGED_KIND: (STAGED_LOOK["color"], STAGED_LOOK["label"])}
_BASELINE, _MARBLE = "weighted_sum", "marble"
_OTHER = "tab:gray"  # an unregistered balancer (an old run's method): grey, labelled by its name
SEED_STYLES = ("-", "--", ":", "-.")


@dataclass(frozen=True)
class Look:
    color: str
    label: str


def known_balancers() -> list[str]:
    """Every balancer a figure knows, in figure order: the baseline first, MARBLE last, the
    others in registration order between them."""
    middle = [m for m in [*BALANCERS, *_STAGED] if m not in (_BASELINE, _MARBLE)]
    return [_BASELINE, *middle, _MARBLE]


def balancer_look(balancer: str) -> Look:
    """The colour and the legend label of a balancer."""
    if balancer in BALANCERS:
        return Look(BALANCERS[balancer].color, BALANCERS[balancer].label)
    if balancer in _STAGED:
        return Look(*_STAGED[balancer])
    return Look(_OTHER, balancer.replace("_", " "))


def balancer_order(balancers) -> list[str]:
    """The distinct balancers in figure order: the known ones as `known_balancers`, then the
    rest by name."""
    known = known_balancers()
    return sorted(dict.fromkeys(balancers), key=lambda b: (known.index(b), "") if b in known else (len(known), b))


def seed_styles(seeds) -> dict:
    """seed -> line style, in sorted order of the seeds present (None, a seedless run, last)."""
    ordered = sorted({s for s in seeds if s is not None}) + ([None] if None in set(seeds) else [])
    return {s: SEED_STYLES[i % len(SEED_STYLES)] for i, s in enumerate(ordered)}
