"""Reward registry: one `RewardDescriptor` per reward (marble.rewards.catalogue), `available()`,
`build(name, **options)`, and `score_all`.

Entries are import paths, so heavy stacks (open_clip, mmdet, paddle, onnxruntime) load
only when the reward that needs them is built. Importing the registry loads no torch: the
workflow, the doctor and the cost model read the descriptors while Snakemake builds its DAG
(`Reward`, `RewardServiceError`, `quoted_target` are re-exported lazily).
"""

from __future__ import annotations

import importlib
import inspect
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Mapping, Sequence

from marble.rewards import user
from marble.rewards.catalogue import PAPER, TOY, Column, RewardDescriptor

if TYPE_CHECKING:
    import torch

    from marble.rewards.base import Reward

# name -> its descriptor: the one table keyed by a reward's name.
REGISTRY: dict[str, RewardDescriptor] = {}
_LAZY = ("Reward", "RewardServiceError", "quoted_target")  # marble.rewards.base imports torch


def __getattr__(attr: str):
    if attr in _LAZY:
        from marble.rewards import base

        return getattr(base, attr)
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


def register(descriptor: RewardDescriptor) -> RewardDescriptor:
    """Add a reward (its scorer module + this descriptor is all a new reward is); a name
    registered twice is an error, not a silent replacement."""
    if descriptor.name in REGISTRY and REGISTRY[descriptor.name] != descriptor:
        raise ValueError(f"reward {descriptor.name!r} is already registered")
    REGISTRY[descriptor.name] = descriptor
    return descriptor


def register_config(entries, root=".") -> list[RewardDescriptor]:
    """Register a workflow config's own rewards (`rewards:`, marble.rewards.user) here and, through
    MARBLE_REWARDS, in every process this one starts."""
    return [register(d) for d in user.install(entries, root)]


def unregister(name: str) -> None:
    """Remove a reward (tests that add a toy one take it out again)."""
    REGISTRY.pop(name, None)


def descriptor(name: str) -> RewardDescriptor:
    """The descriptor of reward `name`; an unknown name is a KeyError naming the known ones."""
    if name not in REGISTRY:
        # a config's own reward is known only where MARBLE_REWARDS names it (a command run by hand)
        hint = "" if user.from_env() else f"; a config's own reward: {user.ENV}=<its config file>"
        raise KeyError(f"unknown reward {name!r} (available: {', '.join(available())}){hint}")
    return REGISTRY[name]


def descriptors() -> list[RewardDescriptor]:
    """Every registered reward, in registration order."""
    return list(REGISTRY.values())


def available() -> list[str]:
    return sorted(REGISTRY)


def reward_class(name: str) -> type[Reward]:
    """The scorer class of `name`: its target's `module:Class`, or `file.py:Class` (a user's
    reward named by a config, marble.rewards.user)."""
    module, cls = descriptor(name).target.split(":")
    found = user.load_module(module) if module.endswith(".py") else importlib.import_module(module)
    try:
        return getattr(found, cls)
    except AttributeError:
        raise AttributeError(f"reward {name!r}: {module} defines no {cls!r}") from None


def applicability(name: str, applies_to=None, options: Mapping | None = None) -> Reward:
    """A reward object that answers `applies(prompt, metadata)` without loading weights.

    Only the base `Reward.__init__` runs: scorer constructors load models, and a mask
    (dataset assembly) needs none of them. Of `options`, only those the class lists in
    `MASK_OPTIONS` are applied (e.g. the OCR `reference_rules`, which changes the target
    rule); the rest are scoring options and play no part in a mask. Use `build` for a
    reward that scores.
    """
    from marble.rewards.base import Reward

    cls = reward_class(name)
    reward = cls.__new__(cls)
    Reward.__init__(reward, applies_to=applies_to)
    for key in set(options or {}) & set(cls.MASK_OPTIONS):
        setattr(reward, key, options[key])
    return reward


def build(name: str, **options) -> Reward:
    return reward_class(name)(**options)


def takes_device(name: str) -> bool:
    """Whether the reward's constructor takes `device` (read from its signature: nothing loads)."""
    return "device" in inspect.signature(reward_class(name).__init__).parameters


def reward_device(setting: str, local_rank: int, cuda: bool | None = None) -> str:
    """`train.reward_device` / `marble evaluate --reward_device`: auto -> cuda:{LOCAL_RANK}
    when CUDA is there (`cuda`: the run trains on CUDA; default torch.cuda.is_available()),
    else cpu."""
    if setting == "auto":
        import torch

        cuda = torch.cuda.is_available() if cuda is None else cuda
        setting = "cuda" if cuda else "cpu"
    return f"cuda:{local_rank}" if setting == "cuda" else setting


def build_scorers(specs: Sequence, device: str | None = None) -> dict[str, Reward]:
    """The scorers of `specs` (`marble.config.RewardSpec`s: name, applies_to, options), by name.

    The one builder of scoring rewards, for training and evaluation. With `device` (training:
    `train.reward_device`), a reward whose constructor takes one gets it unless its options
    set it; without, each reward keeps its own default (evaluation).
    """
    out = {}
    for spec in specs:
        options = dict(spec.options or {})
        if spec.applies_to is not None:
            options["applies_to"] = spec.applies_to
        if device is not None and "device" not in options and takes_device(spec.name):
            options["device"] = device
        out[spec.name] = build(spec.name, **options)
    return out


def build_masks(specs: Sequence) -> dict[str, Reward]:
    """Weight-free rewards that answer `applies(prompt, metadata)` (dataset assembly), by name:
    each spec's `applies_to` override and the options that change a mask (`applicability`)."""
    return {spec.name: applicability(spec.name, spec.applies_to, spec.options) for spec in specs}


def score_all(
    rewards: Mapping[str, Reward],
    images: torch.Tensor,
    prompts: Sequence[str],
    metadata: Sequence[dict] | None = None,
    max_workers: int | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Run every scorer on the same batch in a thread pool; (scores, wall seconds) per reward.

    Threads, not processes: the scorers release the GIL in torch/onnx kernels or wait on
    HTTP, and the models stay loaded once. An exception in any scorer (e.g.
    RewardServiceError) propagates after all have finished.
    """
    if not rewards:
        return {}, {}

    def timed(item):
        name, reward = item
        start = time.perf_counter()
        out = reward(images, prompts, metadata)
        return name, out, time.perf_counter() - start

    workers = max_workers or len(rewards)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reward") as pool:
        futures = [pool.submit(timed, item) for item in rewards.items()]
        errors = [f.exception() for f in futures]
    for err in errors:
        if err is not None:
            raise err
    scores, seconds = {}, {}
    for future in futures:
        name, out, wall = future.result()
        scores[name], seconds[name] = out, wall
    return scores, seconds


for _descriptor in (*TOY, *PAPER):
    register(_descriptor)
# The rewards a config names by import path (MARBLE_REWARDS, set by the Snakefile from the
# config's `rewards:`): registered in every process the workflow starts, not only this one.
for _descriptor in user.from_env():
    register(_descriptor)

__all__ = [
    "REGISTRY",
    "Column",
    "RewardDescriptor",
    "descriptor",
    "descriptors",
    "unregister",
    "Reward",
    "RewardServiceError",
    "applicability",
    "available",
    "build",
    "build_masks",
    "build_scorers",
    "quoted_target",
    "register",
    "register_config",
    "reward_device",
    "score_all",
    "takes_device",
]
