"""Stages of a run (a staged curriculum): the pure dict and step arithmetic of `stages:`.

A run may list `stages:`. Stage i trains `steps` optimizer steps, in order, on the prompts of
its `sources` (sources of `data.train`; `mix`: each source's share of a sampling batch's
prompts), with its `rewards` (names from the run's `rewards:`, whose specs they take), its
`balancer:` keys (merged over the run's) and its `lr`. A stage is the run's config with those
keys replaced (`stage_overlay`), so marble.config builds and validates it exactly like a run
(unknown keys and bad values are errors naming the stage and the key). A run without stages
is one stage: the run itself, unchanged.

Torch-free and marble-free (the configuration layer; the workflow reads it too).
"""

from __future__ import annotations

import math
from bisect import bisect_right

# A staged run (`stages:`) is its own kind in the report and Table 1's "sequential" row, never
# pooled with the joint runs of its stages' balancer (marble.report.loading). Its name and look
# sit here, beside the stages they describe, as each balancer's sit in its descriptor
# (marble.config_balancers): the figures' palette lists no method or run kind of its own.
STAGED_KIND = "sequential"
STAGED_LOOK = {"color": "tab:olive", "label": "sequential stages"}


class StageError(ValueError):
    """A stage that cannot be built; marble.config reports it as a ConfigError."""


def stage_overlay(run: dict, stage: dict, where: str) -> dict:
    """The run's full config dict with the stage's rewards, balancer keys and lr in place."""
    out = {key: value for key, value in run.items() if key != "stages"}
    specs = {spec["name"]: spec for spec in run.get("rewards") or []}
    chosen = stage.get("rewards")
    if chosen is not None:
        unknown = [name for name in chosen if name not in specs]
        if unknown:
            raise StageError(f"`{where}.rewards` names {unknown}, which the run's `rewards` "
                             f"does not define (defined: {sorted(specs)})")
        # The run's spec (weight, applies_to, options): a stage picks rewards, never redefines one.
        out["rewards"] = [specs[name] for name in chosen]
    if stage.get("balancer"):
        out["balancer"] = {**run.get("balancer", {}), **stage["balancer"]}
    if stage.get("lr") is not None:
        out["train"] = {**run.get("train", {}), "lr": stage["lr"]}
    return out


def stage_problem(stage: dict, where: str) -> str | None:
    """What the range table cannot see in one stage: its sources, one share of each."""
    sources, mix = stage.get("sources"), stage.get("mix")
    if sources is not None and (not sources or len(set(sources)) != len(sources)):
        return f"`{where}.sources` = {sources!r}: name each source once, at least one"
    if mix is not None and (sources is None or len(mix) != len(sources)):
        return f"`{where}.mix` needs one share per entry of `{where}.sources`"
    return None


def schedule_problem(names: list[str], lengths: list[int], max_steps: int) -> str | None:
    """A staged run's names are unique and its stages cover every step it trains."""
    if len(set(names)) != len(names) or not all(names):
        return f"`stages` needs a distinct non-empty `name` per stage, got {names}"
    if max_steps > sum(lengths):
        # Steps past the last stage would train under no stage's settings: refuse, not guess.
        return (f"`train.max_steps` = {max_steps} is past the stages' end ({sum(lengths)} = "
                f"{' + '.join(map(str, lengths))} steps)")
    return None


def stage_starts(lengths: list[int]) -> list[int]:
    """The first optimizer step (0-based) of each stage."""
    starts, at = [], 0
    for n in lengths:
        starts.append(at)
        at += n
    return starts


def stage_index(step: int, lengths: list[int]) -> int:
    """The stage that trains optimizer step `step` (0-based: the step taken when the
    trainer's counter reads `step`). Without stages (no lengths), stage 0."""
    if not lengths:
        return 0
    return min(bisect_right(stage_starts(lengths), step) - 1, len(lengths) - 1)


def source_counts(m: int, shares: list[float]) -> list[int]:
    """m prompts split by shares (largest remainder, ties to the first source): the
    per-source prompt counts of a mixed sampling batch."""
    total = sum(shares)
    exact = [m * s / total for s in shares]
    counts = [math.floor(x) for x in exact]
    order = sorted(range(len(shares)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[:m - sum(counts)]:
        counts[i] += 1
    return counts
