"""Range checks of the run config: every number in its range, so a bad value fails at load
time naming its key (`train.batch_size` = 0 must be > 0), not deep in a run as a
ZeroDivisionError or a silent NaN. Pure functions over a RunConfig (marble.config calls them).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

# Keys whose value must be > 0 (counts of steps, samples, pixels; step sizes), >= 0, in [0, 1].
POSITIVE_KEYS = (
    "model.lora_rank", "model.max_sequence_length", "sampling.num_steps", "sampling.resolution",
    "sampling.images_per_prompt", "sampling.batch_size", "sampling.num_batches_per_epoch",
    "sampling.eval_num_steps", "train.batch_size", "train.max_steps", "train.save_every",
    "train.log_every", "train.lr", "train.adam_eps", "train.nft_beta",
    "train.adv_clip", "train.max_grad_norm", "balancer.amortize_every",
)
# keep_checkpoints 0 keeps every checkpoint (marble.training.checkpoint.prune_checkpoints).
NON_NEGATIVE_KEYS = ("train.keep_checkpoints", "model.lora_alpha", "sampling.guidance_scale", "train.kl_beta", "train.weight_decay",
                     "balancer.warmup_steps", "balancer.grad_eps")
UNIT_INTERVAL_KEYS = ("train.ema_decay", "train.old_decay_cap")  # [0, 1]


def _value(cfg, key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _non_finite(node: Any, where: str = "") -> str | None:
    """The first float key (dotted) holding NaN or inf, or None."""
    if dataclasses.is_dataclass(node):
        for f in dataclasses.fields(node):
            found = _non_finite(getattr(node, f.name), f"{where}.{f.name}" if where else f.name)
            if found:
                return found
    elif isinstance(node, list):
        for i, item in enumerate(node):
            found = _non_finite(item, f"{where}[{i}]")
            if found:
                return found
    elif isinstance(node, float) and not math.isfinite(node):
        return where
    return None


def range_problem(cfg) -> str | None:
    """The first value out of its range, as "`key` = value must be ..." (None: all fine)."""
    bad = _non_finite(cfg)
    if bad:
        return f"`{bad}` = {_value_at(cfg, bad)!r} must be a finite number"
    for keys, ok, rule in ((POSITIVE_KEYS, lambda v: v > 0, "> 0"), (NON_NEGATIVE_KEYS, lambda v: v >= 0, ">= 0"),
                           (UNIT_INTERVAL_KEYS, lambda v: 0 <= v <= 1, "in [0, 1]")):
        for key in keys:
            if not ok(_value(cfg, key)):
                return f"`{key}` = {_value(cfg, key)!r} must be {rule}"
    betas = cfg.train.adam_betas
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        return f"`train.adam_betas` = {betas!r} must be two values in [0, 1)"
    return None


def _value_at(cfg, dotted: str) -> Any:
    """The value at a key such as `train.adam_betas[1]`."""
    head, _, index = dotted.partition("[")
    value = _value(cfg, head)
    return value[int(index.rstrip("]"))] if index else value
