"""The one interface every reward implements.

A reward is called as `reward(images, prompts, metadata) -> Tensor[N]` (float32) with
`images` a float tensor [N, 3, H, W] in [0, 1] on the CPU. It returns NaN where it does
not apply to the prompt (`applies` is False) or where the sample could not be scored;
NaN is masked downstream (never read as a zero) and counted in `failures`.
A remote scorer also sets `failed_rows` (bool per row it scored) where the NaN is a failed
request rather than a judgement; after a call `last_failed` holds that per row of the call,
so evaluation can store those as missing and retry them on the next run.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Sequence

import torch

# Where the downloaded checkpoints live is the assets' business; the scorers read it here.
from marble.assets.manifest import DEFAULT_CKPT_DIR, DOWNLOAD_HINT, ckpt_dir  # noqa: F401

_QUOTED = re.compile(r'"([^"]+)"')
# OpenAI CLIP's pixel normalisation (per RGB channel), shared by the CLIP-based scorers.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)



class RewardServiceError(RuntimeError):
    """A reward failed on too many samples to trust the batch (e.g. its server is down)."""


def quoted_target(prompt: str) -> str | None:
    """The first non-empty double-quoted span of a prompt, or None (the OCR rule)."""
    for match in _QUOTED.finditer(prompt):
        if match.group(1).strip():
            return match.group(1)
    return None


def reference_quoted_target(prompt: str) -> str | None:
    """The reference's OCR target: the text between the first and second double quote
    (to the end when unterminated); None when there is no quote or that text is empty.

    A target of spaces only is None too: the reference divides by its length after
    removing spaces and crashes there; here such a prompt does not apply (NaN).
    """
    parts = prompt.split('"')
    if len(parts) < 2 or not parts[1].replace(" ", ""):
        return None
    return parts[1]


def require_file(reward: str, path: str | os.PathLike, folder: str | os.PathLike | None = None) -> Path:
    """`path` (relative paths resolved in `folder` first), or a FileNotFoundError naming the fix."""
    path = Path(path)
    if folder is not None and not path.is_absolute() and not path.exists():
        path = Path(folder) / path
    if not path.is_file():
        hint = DOWNLOAD_HINT.format(dir=folder or DEFAULT_CKPT_DIR)
        raise FileNotFoundError(
            f"reward {reward!r}: checkpoint file {path} is missing; download it with `{hint}`"
        )
    return path


def to_uint8_hwc(images: torch.Tensor):
    """[N,3,H,W] floats in [0,1] -> numpy uint8 [N,H,W,3] (what PIL/OCR/detectors take)."""
    arr = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)
    return arr.permute(0, 2, 3, 1).cpu().numpy()


def to_pil(images: torch.Tensor) -> list:
    from PIL import Image

    return [Image.fromarray(a) for a in to_uint8_hwc(images)]


class Reward:
    """Base class: subclasses set `name` and implement `score` on the applicable rows."""

    name: str = "reward"
    # Options that change `applies` (set by `marble.rewards.applicability` without a build).
    MASK_OPTIONS: tuple[str, ...] = ()

    def __init__(self, applies_to: Sequence[str] | None = None, **options):
        if options:
            raise TypeError(f"reward {self.name!r}: unknown options {sorted(options)}")
        # Config override of the content rule: only these sources (metadata["source"]).
        self.applies_to = None if applies_to is None else set(applies_to)
        self.failures = 0  # samples that applied but could not be scored
        self.scored = 0
        self.failed_rows: torch.Tensor | None = None  # set by `score` of a remote scorer
        self.last_failed = torch.zeros(0, dtype=torch.bool)  # per row of the last call

    # -- applicability -------------------------------------------------------
    def applies_by_content(self, prompt: str, metadata: dict) -> bool:
        return True

    def applies(self, prompt: str, metadata: dict) -> bool:
        if self.applies_to is not None:
            return (metadata or {}).get("source") in self.applies_to
        return self.applies_by_content(prompt, metadata or {})

    # -- scoring ---------------------------------------------------------------
    def score(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> torch.Tensor:
        """Scores for rows that apply; NaN marks an unscorable sample."""
        raise NotImplementedError

    def counters(self) -> dict[str, int]:
        """Running counts for logs: scored samples and failures (NaN among applicable)."""
        return {"scored": self.scored, "failures": self.failures}

    def __call__(self, images, prompts: Sequence[str], metadata: Sequence[dict] | None = None):
        prompts = list(prompts)
        metadata = [dict(m or {}) for m in (metadata or [{}] * len(prompts))]
        if len(images) != len(prompts) or len(metadata) != len(prompts):
            raise ValueError(
                f"reward {self.name!r}: {len(images)} images, {len(prompts)} prompts, "
                f"{len(metadata)} metadata records"
            )
        if len(images) and (images.ndim != 4 or images.shape[1] != 3):
            raise ValueError(f"reward {self.name!r}: images must be [N,3,H,W], got {tuple(images.shape)}")
        out = torch.full((len(prompts),), float("nan"), dtype=torch.float32)
        idx = [i for i, (p, m) in enumerate(zip(prompts, metadata)) if self.applies(p, m)]
        self.last_failed = torch.zeros(len(prompts), dtype=torch.bool)
        if idx:
            self.failed_rows = None
            with torch.no_grad():
                sub = self.score(images[idx], [prompts[i] for i in idx], [metadata[i] for i in idx])
            sub = sub.detach().to(torch.float32).cpu()
            # +-inf is no more a score than NaN (a -inf on every sample trained to "done"
            # where NaN failed the run): every non-finite value is unscorable, NaN, counted.
            out[idx] = torch.where(torch.isfinite(sub), sub, torch.full_like(sub, float("nan")))
            if self.failed_rows is not None:
                self.last_failed[idx] = self.failed_rows & torch.isnan(out[idx])
            self.scored += len(idx)
            self.failures += int(torch.isnan(out[idx]).sum())
        return out
