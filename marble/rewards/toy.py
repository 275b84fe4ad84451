"""Cheap pixel-statistic rewards for the `tiny` preset: no downloads, milliseconds per batch.

They stand in for the paper's reward mix at toy scale, keeping its structure: two
generalists that apply to every prompt and partly conflict (brightness pushes towards
white, which has zero saturation), and two specialists that apply only to a subset of
prompts by content, as GenEval and OCR do. The tiny run then shows whether a balancer
keeps the specialists improving while the generalists pull elsewhere.
"""

from __future__ import annotations

import torch

from marble.rewards.base import Reward, quoted_target
from marble.rewards.geneval_rules import COLORS

# Fixed RGB (0-255) of the GenEval colours (CSS values), in the order of their one list,
# geneval_rules.COLORS: red, orange, yellow, green, blue, purple, pink, brown, black, white.
_CSS_RGB = ((255, 0, 0), (255, 165, 0), (255, 255, 0), (0, 128, 0), (0, 0, 255), (128, 0, 128),
            (255, 192, 203), (139, 69, 19), (0, 0, 0), (255, 255, 255))
GENEVAL_COLORS: dict[str, tuple[int, int, int]] = dict(zip(COLORS, _CSS_RGB, strict=True))

_LUMA = torch.tensor([0.299, 0.587, 0.114], dtype=torch.float64)  # Rec. 601 weights


# Why float64: the scorers run in a thread pool, where a torch kernel's thread team (and so
# its float32 summation order) can differ from run to run; in float64 that order changes a
# score by ~1e-16 instead of one float32 ulp, so two runs on the same 8-bit images agree.
def luminance(images: torch.Tensor) -> torch.Tensor:
    """[N,3,H,W] in [0,1] -> [N,H,W] Rec. 601 luma (float64)."""
    return torch.einsum("nchw,c->nhw", images.double(), _LUMA)


def hsv_saturation(images: torch.Tensor) -> torch.Tensor:
    """[N,3,H,W] -> [N,H,W] HSV saturation (max-min)/max, 0 where max is 0 (black)."""
    hi = images.double().amax(dim=1)
    lo = images.double().amin(dim=1)
    return torch.where(hi > 0, (hi - lo) / hi.clamp_min(1e-12), torch.zeros_like(hi))


def first_named_color(metadata: dict) -> str | None:
    """The colour of the first `include` clause that names one (GenEval records), else None."""
    for clause in metadata.get("include") or []:
        if isinstance(clause, dict) and clause.get("color"):
            return str(clause["color"])
    return None


def color_match(images: torch.Tensor, color: str) -> torch.Tensor:
    """1 - ||mean RGB - colour RGB|| / sqrt(3), in [0,1] (1: the mean colour is exactly it)."""
    if color not in GENEVAL_COLORS:
        raise KeyError(f"unknown GenEval colour {color!r} (known: {', '.join(GENEVAL_COLORS)})")
    target = torch.tensor(GENEVAL_COLORS[color], dtype=torch.float64) / 255.0
    mean_rgb = images.double().mean(dim=(2, 3))
    return (1.0 - torch.linalg.vector_norm(mean_rgb - target, dim=1) / 3**0.5).float()


def rms_contrast(images: torch.Tensor) -> torch.Tensor:
    """Standard deviation of the luma over the image, in [0, 0.5]: legible text on a
    background raises it; smooth in the pixels (unlike an edge count)."""
    return luminance(images).flatten(1).std(dim=1, unbiased=False).float()


class ToyBrightness(Reward):
    """Mean luma in [0,1]. Generalist (all prompts); maximised by white, which the
    saturation reward scores 0: the intended conflict."""

    name = "toy_brightness"

    def score(self, images, prompts, metadata):
        return luminance(images).mean(dim=(1, 2)).float()


class ToySaturation(Reward):
    """Mean HSV saturation in [0,1]. Generalist (all prompts); pure hues score 1, white
    and grey 0, so it partly conflicts with brightness."""

    name = "toy_saturation"

    def score(self, images, prompts, metadata):
        return hsv_saturation(images).mean(dim=(1, 2)).float()


class ToyColorMatch(Reward):
    """Specialist like GenEval: applies only to records whose `include` clauses name a
    colour, and scores how close the image's mean colour is to the first named one."""

    name = "toy_color_match"

    def applies_by_content(self, prompt, metadata):
        return first_named_color(metadata) in GENEVAL_COLORS

    def score(self, images, prompts, metadata):
        colors = [first_named_color(m) for m in metadata]
        return torch.stack([color_match(images[i : i + 1], c)[0] for i, c in enumerate(colors)])


class ToyTextContrast(Reward):
    """Specialist like OCR: applies only to prompts with a quoted span, and scores the
    luma contrast (RMS), which legible text on a background raises. It partly conflicts
    with brightness (a white page has none) and with saturation (black-on-white text)."""

    name = "toy_text_contrast"

    def applies_by_content(self, prompt, metadata):
        return quoted_target(prompt) is not None

    def score(self, images, prompts, metadata):
        return rms_contrast(images)


def left_right_luma(images: torch.Tensor) -> torch.Tensor:
    """(mean luma of the left half - mean luma of the right half + 1) / 2, in [0,1]; an odd
    width leaves the middle column out, so a left-right mirror maps s to 1 - s exactly."""
    luma = luminance(images)
    half = luma.shape[-1] // 2
    left, right = luma[..., :half], luma[..., luma.shape[-1] - half:]
    return ((left.mean(dim=(1, 2)) - right.mean(dim=(1, 2)) + 1.0) / 2.0).float()


class ToyLeftBright(Reward):
    """Specialist like OCR's prompts (a quoted span), built for the claim's question (b)
    (issue 47 item 1): the left half brighter than the right. Why this objective: it asks for
    a layout, not a level, so moving light from right to left leaves the mean luma (brightness)
    and the saturation where they were: its gradient neither helps nor opposes the
    generalists', and the weighted sum can only attenuate its signal (the 1/3 share it has of
    the combined advantage on its prompts), not oppose it, which is the dilution the paper's
    (b) is about. Starts near 0.5 (no side favoured), so there is room above it."""

    name = "toy_left_bright"

    def applies_by_content(self, prompt, metadata):
        return quoted_target(prompt) is not None

    def score(self, images, prompts, metadata):
        return left_right_luma(images)


def warmth(images: torch.Tensor) -> torch.Tensor:
    """(mean R - mean B + 1) / 2 over the image, in [0,1] (float64 sums, as luminance)."""
    rgb = images.double().mean(dim=(2, 3))
    return ((rgb[:, 0] - rgb[:, 2] + 1.0) / 2.0).float()


class ToyWarmth(Reward):
    """Specialist on the quoted-span prompts (as text contrast), the claim's (b) specialist
    after toy_left_bright's pilot (issue 47 item 1, docs/claim.md): red over blue. Why this
    objective: a global colour shift the tiny model learns in a few steps (as it learns
    brightness and saturation), and one the generalists do not oppose (more red and less blue
    raises the luma, 0.299 - 0.114 per unit, and the spread max - min of a grey pixel), so the
    weighted sum's combined advantage can attenuate its signal but not turn it round. Starts
    near 0.5: room above."""

    name = "toy_warmth"

    def applies_by_content(self, prompt, metadata):
        return quoted_target(prompt) is not None

    def score(self, images, prompts, metadata):
        return warmth(images)


class ToyBrightnessCopy(ToyBrightness):
    """toy_brightness under a second name: the claim's no-conflict control (issue 36 item 3,
    docs/claim.md). A run's rewards need distinct names, so a second copy of one objective
    needs its own; with `applies_to: [ocr]` it is a specialist with text contrast's prompts
    and brightness's objective, so every reward wants the same image and any negative cosine
    is gradient noise, not conflict."""

    name = "toy_brightness_copy"


# Issue 47 item 6: the control needs as many rewards as the real set (K = 4): the minimum of K
# noisy cosines is negative more often for larger K, so a control with fewer copies would
# count the real set's extra rewards as conflict. Each copy is brightness under its own name.
class ToyBrightnessCopy2(ToyBrightness):
    """toy_brightness under a third name (the K-copies control; config.yaml `claim.control`)."""

    name = "toy_brightness_copy2"


class ToyBrightnessCopy3(ToyBrightness):
    """toy_brightness under a fourth name (the K-copies control; config.yaml `claim.control`)."""

    name = "toy_brightness_copy3"
