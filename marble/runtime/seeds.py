"""The one way marble derives a seed from a key: blake2b of the key as JSON.

    stable_seed(*key) = int.from_bytes(blake2b(json.dumps(list(key)), digest_size=8), "little")
                        & (2**63 - 1)

with each key part an int or a str (JSON: ints as decimals, strings quoted and escaped, so
("1", 2) and (1, "2") differ). A 63-bit non-negative int, what `torch.Generator.manual_seed`
takes; stable across processes, platforms and Python versions (unlike `hash()`, which is
salted per process). Users: the training rollouts' noise, timestep subsets and shuffles
(`keyed_generator(seed, stream, epoch, index)`), evaluation's per-sample noise
(`marble.evaluation.prompts.sample_seed`), the tiny model's pretraining pictures (a hue per
prompt). Changing this changes every result; the training path has always used it.
"""

from __future__ import annotations

import hashlib
import json

import torch

SEED_BITS = 63


def stable_seed(*key: int | str) -> int:
    """A 63-bit seed from a tuple of ints and strings (see the module docstring)."""
    parts = [k if isinstance(k, str) else int(k) for k in key]
    digest = hashlib.blake2b(json.dumps(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << SEED_BITS) - 1)


def keyed_generator(*key: int | str, device: str | torch.device = "cpu") -> torch.Generator:
    """A torch.Generator seeded with `stable_seed(*key)`."""
    gen = torch.Generator(device=device)
    gen.manual_seed(stable_seed(*key))
    return gen
