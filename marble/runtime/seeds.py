"""The one way marble derives a seed from a key: blake2b of the key as JSON.

    stable_seed(*key) = int.from_bytes(blake2b(json.dumps(list(key)), digest_size=8), "little")
                        & (2**63 - 1)

with each key part an int or a str (JSON: ints as decimals, strings quoted and escaped, so
("1", 2) and (1, "2") differ). A 63-bit non-negative int, what `torch.Generator.manual_seed`
takes; stable across processes, platforms and Python versions (unlike `hash()`, which is
salted per process). Users: the training rollouts' noise, timestep subsets and shuffles
(`keyed_generator(seed, stream, epoch, index)`), the prompt sampler's plan per (seed,
epoch) (`marble.data.sampler.plan_seed`), the LoRA init, evaluation's per-sample noise
(`marble.evaluation.prompts.sample_seed`), the tiny model's pretraining (a hue per prompt,
each picture's variation, the noise of every optimisation step). Changing this changes
every result.

Streams: the integer constants below name what a seed is for, so two uses of one
(seed, epoch) never draw the same numbers. torch is imported only by `keyed_generator`:
the torch-free sampler uses `stable_seed` alone.
"""

from __future__ import annotations

import hashlib
import json

SEED_BITS = 63
# Stream ids (the training rollout's 1-3 live in marble/training/rollout.py, unchanged).
STREAM_PROMPT_PLAN = 4
STREAM_LORA_INIT = 5
STREAM_PRETRAIN = 6


def stable_seed(*key: int | str) -> int:
    """A 63-bit seed from a tuple of ints and strings (see the module docstring)."""
    parts = [k if isinstance(k, str) else int(k) for k in key]
    digest = hashlib.blake2b(json.dumps(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << SEED_BITS) - 1)


def keyed_generator(*key: int | str, device="cpu"):
    """A torch.Generator seeded with `stable_seed(*key)`."""
    import torch  # deferred: stable_seed users (the sampler) stay torch-free

    gen = torch.Generator(device=device)
    gen.manual_seed(stable_seed(*key))
    return gen
