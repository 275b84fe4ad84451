"""The one range table of the run config: every numeric key (and each enumerated one that is
not a `Literal`) with the values it may take, so a bad value fails at load time as one line
naming its key (`train.nft_beta` = 0.0 must be > 0), not mid-run as a ZeroDivisionError or a
silent NaN. Pure functions over a RunConfig (marble.config calls `range_problem`).

Adding a key: one line in RANGES, e.g. `"train.my_count": above(0),`. tests/test_config.py
walks the typed tree (`numeric_keys(RunConfig)`) and fails on a numeric key without a line
here, and on a line naming no key. A `Literal[...]` key needs none: its type is its range,
checked when the tree is built. A key inside a list of sections (`rewards.weight`) is checked
in every item (`rewards[1].weight`). Cross-field rules (sums, divisibility) stay in
`marble.config.validate`.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Literal, get_args, get_origin


@dataclass(frozen=True)
class Rule:
    ok: Callable[[Any], bool]
    text: str  # what a value must be, after "must be": "> 0", "in [0, 1)"
    length: int | None = None  # a list key: how many values (None: any number)
    each: bool = False  # a list key: `ok` applies to each value
    outside: tuple = ()  # values just out of range (tests/test_config.py loads each: it must fail)


def above(low: float) -> Rule:
    return Rule(lambda v: v > low, f"> {low}", outside=(low, low - 1))


def at_least(low: float) -> Rule:
    return Rule(lambda v: v >= low, f">= {low}", outside=(low - 1,))


def interval(text: str) -> Rule:
    """`[0, 1]`, `(0, 1]`, `[0, 1)`, `(0, 1)`: closed or open at each end, as written."""
    match = re.fullmatch(r"([\[(])\s*([-\d.e]+)\s*,\s*([-\d.e]+)\s*([\])])", text)
    if not match:
        raise ValueError(f"interval {text!r}: expected e.g. '[0, 1)'")
    lo_open, lo, hi, hi_open = match[1] == "(", float(match[2]), float(match[3]), match[4] == ")"
    return Rule(lambda v: (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi),
                f"in {text}", outside=(lo if lo_open else lo - 0.5, hi if hi_open else hi + 0.5))


def one_of(*values: Any) -> Rule:
    return Rule(lambda v: v in values, "one of " + ", ".join(repr(v) for v in values),
                outside=(max(values) + 1,))


def each(rule: Rule, length: int | None = None) -> Rule:
    """Every value of a list key obeys `rule` (and there are `length` of them)."""
    count = f"{length} values" if length else "values"
    return Rule(rule.ok, f"{count} {rule.text}", length=length, each=True,
                outside=tuple([bad] * (length or 1) for bad in rule.outside))


ANY_INTEGER = Rule(lambda v: True, "any integer")  # a seed: every int is a valid one
CUDA_INDEX = re.compile(r"cuda:\d+")

RANGES: dict[str, Rule] = {
    "model.lora_rank": above(0),
    "model.lora_alpha": at_least(0),
    "model.max_sequence_length": above(0),
    "sampling.num_steps": above(0),
    "sampling.resolution": above(0),
    "sampling.guidance_scale": at_least(0),
    "sampling.images_per_prompt": above(0),
    "sampling.batch_size": above(0),
    "sampling.num_batches_per_epoch": above(0),
    "sampling.eval_num_steps": above(0),
    "train.eval_every": at_least(0),  # 0: no held-out evaluation
    "train.eval_images_per_prompt": above(0),
    "train.eval_max_prompts": above(0),  # None: the whole test split
    "train.batch_size": above(0),
    "train.timestep_fraction": interval("(0, 1]"),  # T_train = floor(num_steps * fraction) >= 1
    "train.nft_beta": above(0),  # divides the velocity difference (docs/algorithm.md §4)
    "train.kl_beta": at_least(0),
    "train.adv_clip": above(0),
    "train.lr": above(0),
    "train.adam_betas": each(interval("[0, 1)"), length=2),
    "train.weight_decay": at_least(0),
    "train.adam_eps": above(0),
    "train.max_grad_norm": above(0),
    "train.ema_decay": interval("[0, 1]"),
    "train.old_decay_type": one_of(0, 1, 2),  # docs/algorithm.md §5
    "train.old_decay_cap": interval("[0, 1]"),
    "train.max_steps": above(0),
    "train.save_every": above(0),
    "train.keep_checkpoints": at_least(0),  # 0 keeps every checkpoint (prune_checkpoints)
    "train.log_every": above(0),
    "train.seed": ANY_INTEGER,
    "train.reward_device": Rule(lambda v: v in ("auto", "cpu", "cuda") or bool(CUDA_INDEX.fullmatch(v)),
                                "auto, cpu, cuda or cuda:N", outside=("gpu", "cuda:x")),
    "train.reference_images_per_step": above(0),  # None: no reference geometry
    "balancer.amortize_every": above(0),
    "balancer.warmup_steps": at_least(0),
    "balancer.alpha_ema": interval("[0, 1)"),  # rho = 1 would freeze alpha at its first solve
    "balancer.fixed_alphas": each(interval("[0, 1]")),  # their count and sum: validate()
    "balancer.grad_eps": at_least(0),
    "balancer.diagnostics_every": at_least(0),  # 0 = off
    "rewards.weight": at_least(0),  # a weighted-sum weight; that one is > 0: validate()
    "stages.steps": above(0),  # a stage trains at least one step (marble.config_stages)
    "stages.mix": each(above(0)),  # shares of a sampling batch; their count: config_stages
    "stages.lr": above(0),  # None: the run's train.lr
}


def _plain(tp: Any) -> Any:
    """`X | None` -> X; anything else unchanged."""
    if get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _is_number(tp: Any) -> bool:
    return tp in (int, float)


def _leaves(cls: type, prefix: str = ""):
    """(dotted key, type, list item type or None) of every leaf of the dataclass tree `cls`;
    a list of sections contributes its item's keys (`rewards.weight`)."""
    for name, tp in typing.get_type_hints(cls).items():
        key, tp = f"{prefix}{name}", _plain(tp)
        inner = _plain(get_args(tp)[0]) if get_origin(tp) is list and get_args(tp) else None
        if dataclasses.is_dataclass(tp):
            yield from _leaves(tp, key + ".")
        elif inner is not None and dataclasses.is_dataclass(inner):
            yield from _leaves(inner, key + ".")
        else:
            yield key, tp, inner


def numeric_keys(cls: type) -> list[str]:
    """The keys whose value is a number or a list of numbers (bools and Literals excluded)."""
    return [key for key, tp, inner in _leaves(cls) if _is_number(tp) or _is_number(inner)]


def literal_keys(cls: type) -> list[str]:
    """The keys whose type is a Literal (or a list of one): their type is their range."""
    return [key for key, tp, inner in _leaves(cls)
            if get_origin(tp) is Literal or get_origin(inner) is Literal]


def values_at(cfg: Any, key: str) -> list[tuple[str, Any]]:
    """(dotted path, value) of `key` in `cfg`: one pair, or one per item of a list section."""
    found = [("", cfg)]
    for part in key.split("."):
        nxt = []
        for path, node in found:
            if isinstance(node, list):  # a list of sections: every item
                nxt += [(f"{path}[{i}].{part}", getattr(item, part)) for i, item in enumerate(node)]
            else:
                nxt.append((f"{path}.{part}" if path else part, getattr(node, part)))
        found = nxt
    return found


def _non_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def _value_problem(path: str, value: Any, rule: Rule) -> str | None:
    if value is None:
        return None  # an optional key left unset
    if rule.each:
        if rule.length is not None and len(value) != rule.length:
            return f"`{path}` = {value!r} must be {rule.text}"
        for i, item in enumerate(value):
            if _non_finite(item):
                return f"`{path}[{i}]` = {item!r} must be a finite number"
            if not rule.ok(item):
                return f"`{path}` = {value!r} must be {rule.text}"
        return None
    if _non_finite(value):
        return f"`{path}` = {value!r} must be a finite number"
    if not rule.ok(value):
        return f"`{path}` = {value!r} must be {rule.text}"
    return None


def range_problem(cfg: Any) -> str | None:
    """The first value out of its range, as "`key` = value must be ..." (None: all fine)."""
    for key, rule in RANGES.items():
        for path, value in values_at(cfg, key):
            found = _value_problem(path, value, rule)
            if found:
                return found
    return None
