"""Reward registry: `available()`, `build(name, **options)`.

Entries are import paths, so heavy stacks (open_clip, mmdet, paddle, onnxruntime) load
only when the reward that needs them is built.
"""

from __future__ import annotations

import importlib

from marble.rewards.base import Reward, quoted_target

# name -> "module:Class"; filled in by the reward modules' authors.
REGISTRY: dict[str, str] = {}


def register(name: str, target: str) -> None:
    REGISTRY[name] = target


def available() -> list[str]:
    return sorted(REGISTRY)


def build(name: str, **options) -> Reward:
    if name not in REGISTRY:
        raise KeyError(f"unknown reward {name!r} (available: {', '.join(available())})")
    module, cls = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)(**options)


__all__ = ["Reward", "available", "build", "quoted_target", "register"]
