"""Whether a finished run trained at all (pure): a run that learned nothing is a failure.

A damaged input (an embedding cache of flipped floats, a reward head that returns NaN)
used to make every reward NaN and every optimizer step "skipped", and the run still
exited 0 with a train_summary.json the workflow took for a result. `failed_run_reason`
reads the run's metrics.jsonl records and names what went wrong: every logged step
skipped (non-finite gradients), or a reward applicable to some samples and NaN on every
logged step (never scored). A reward that applied to no sample is the masks' business
(counted as reward_applicable/<name> = 0), not a failure.
"""

from __future__ import annotations

import math


def _nan(value) -> bool:
    """Not a score: null, NaN or +-inf alike (a -inf reward on every step was taken as trained)."""
    return value is None or (isinstance(value, float) and not math.isfinite(value))


def failed_run_reason(records: list[dict], reward_names: list[str]) -> str | None:
    """None for a run that trained; else one phrase saying why it did not."""
    steps = [r for r in records if isinstance(r, dict) and "step" in r]
    if not steps:
        return None  # max_steps 0, or nothing logged: nothing to judge
    if all(r.get("skipped_step", 0.0) == 1.0 for r in steps):
        return (f"every one of the {len(steps)} logged steps was skipped (non-finite gradients: "
                "check the rewards and the embedding cache)")
    for name in reward_names:
        applied = sum(r.get(f"reward_applicable/{name}", 0) or 0 for r in steps)
        if applied and all(_nan(r.get(f"reward/{name}")) for r in steps):
            return (f"reward {name!r} was NaN on every logged step ({applied} applicable samples, "
                    "none scored to a finite number; +-inf counts as NaN): its scorer or its inputs are broken")
    return None
