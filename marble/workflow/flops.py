"""The counted FLOPs the GPU-hour plan prices with: the stored table and its keys. Torch-free.

`marble/workflow/flops_table.json` is written by `python -m marble.tools.flops_table --write`,
which counts on meta tensors with `marble bench flops`'s own functions (the trainer's
micro-step per balancer row, the rollout sampler, each model's forward and VAE decode);
tests/test_flops_table.py recounts it and fails when it is stale. The plan runs inside
every `snakemake -n`: counting there would import torch and take minutes at SD3.5M size,
so it reads the table, keyed by the shapes that change a count (this module's `*_key`).

What the table does not count, the reward scorers and the UnifiedReward judge, is each
reward's descriptor's `flops` (marble.rewards.catalogue: parameter counts x tokens, 2 N T).
Each figure names its inputs; none has a run behind it (a hypothesis until a GPU measures
an evaluation job).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from marble.assets.hub_ref import is_hub_ref, parse_hub_ref
from marble.config import SD3_LORA_TARGETS
from marble.rewards import descriptor
from marble.workflow.evaluation import JUDGE, row_protocol
TABLE_PATH = Path(__file__).with_name("flops_table.json")
REGENERATE = "python -m marble.tools.flops_table --write"

# Base-model repos the evaluation rows name (config/eval.yaml's protocols) -> counted architecture.
HUB_ARCH = {
    "stabilityai/stable-diffusion-3.5-medium": "sd35m",
    "stabilityai/stable-diffusion-3.5-large": "sd35l",
    "stabilityai/stable-diffusion-xl-base-1.0": "sdxl",
    "black-forest-labs/FLUX.1-dev": "flux_dev",
}
# Text tokens of an SD3-family evaluation: CLIP's 77 + T5's 256 (marble.evaluation.runner's
# T5_LENGTH, and the StableDiffusion3Pipeline default the generic path uses).
SD3_EVAL_TEXT = 77 + 256


@dataclass(frozen=True)
class Arch:
    """What an evaluation with this base model runs besides its denoiser."""

    vae: str  # the VAE architecture (table key)
    eval_text_tokens: int  # the denoiser's text sequence at evaluation
    encoders: tuple[str, ...]  # text encoders run once per prompt (table keys)
    cfg_doubles: bool  # CFG > 1 runs a negative-prompt pass (FLUX.1-dev's guidance is distilled)


ARCHS = {
    "tiny": Arch("tiny", SD3_EVAL_TEXT, (), True),
    "sd35m": Arch("sd3", SD3_EVAL_TEXT, ("clip_l", "clip_g", "t5_xxl@256"), True),
    "sd35l": Arch("sd3", SD3_EVAL_TEXT, ("clip_l", "clip_g", "t5_xxl@256"), True),
    "sdxl": Arch("sdxl", 77, ("clip_l", "clip_g"), True),
    # FluxPipeline: T5 at 512 tokens, CLIP-L pooled; its VAE has SD3's architecture.
    "flux_dev": Arch("sd3", 512, ("clip_l", "t5_xxl@512"), False),
}

# The served judge's FLOPs are priced apart from the scorers' (a judged evaluation's largest
# uncertain term).
JUDGE_FLOPS = descriptor(JUDGE).flops


def scorer_flops(name: str) -> float:
    """Estimated FLOPs of scoring one image with reward `name` (its descriptor's `flops`; an
    unregistered name is a KeyError naming the registered ones)."""
    return descriptor(name).flops


def training_arch(model_path: str) -> str:
    """The denoiser a run trains, as `marble bench flops` builds it (a path naming `tiny` is
    the tiny model; anything else SD3.5 Medium)."""
    return "tiny" if "tiny" in str(model_path) else "sd35m"


def micro_key(cfg) -> str:
    """What changes the counted FLOPs of one training micro-step (marble.config.RunConfig)."""
    m = cfg.model
    return (f"{training_arch(m.path)}/b{cfg.train.batch_size}/{cfg.sampling.resolution}px/"
            f"{_lora(m)}/K{len(cfg.rewards)}/t{77 + m.max_sequence_length}/"
            f"{m.base_dtype}+{m.mixed_precision}")


def _lora(m) -> str:
    """The LoRA's rank, and its target modules when they are not the default set."""
    targets = sorted(m.lora_targets or [])
    if targets == sorted(SD3_LORA_TARGETS):
        return f"r{m.lora_rank}"
    return f"r{m.lora_rank}:" + hashlib.sha256("+".join(targets).encode()).hexdigest()[:8]


def rollout_key(cfg) -> str:
    """What changes the counted FLOPs of sampling one rollout image."""
    m, s = cfg.model, cfg.sampling
    passes = 2 if (s.guidance_scale or 1.0) > 1.0 else 1
    return (f"{training_arch(m.path)}/{s.resolution}px/{_lora(m)}/t{77 + m.max_sequence_length}/"
            f"{s.solver}/{s.num_steps}steps/x{passes}")


def forward_key(arch: str, resolution: int, text_tokens: int) -> str:
    return f"{arch}/{resolution}px/t{text_tokens}"


def vae_key(vae: str, resolution: int) -> str:
    return f"{vae}/{resolution}px"


class Missing(KeyError):
    """A shape the table has not counted (the plan names it and prices the rest)."""

    def __str__(self) -> str:
        return f"{self.args[0]} not counted in {TABLE_PATH.name} (regenerate: {REGENERATE})"


@lru_cache(maxsize=4)
def load_table(path: Path = TABLE_PATH) -> dict:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{path}: unreadable FLOP table ({exc}); regenerate: {REGENERATE}") from None


def lookup(table: dict, section: str, key: str):
    try:
        return table[section][key]
    except KeyError:
        raise Missing(f"{section} {key!r}") from None


def eval_arch(row: dict, mode: str) -> str:
    """The denoiser an evaluation row runs (`row`: marble.workflow.evaluation.row_protocol):
    the workflow's own model, or the base model its protocol names on the hub."""
    model = row.get("model")
    if not model:
        return "tiny" if mode == "tiny" else "sd35m"
    if is_hub_ref(model) and parse_hub_ref(model)[0] in HUB_ARCH:
        return HUB_ARCH[parse_hub_ref(model)[0]]
    raise Missing(f"base model {model!r}")


def eval_shapes(config: dict, run_names) -> set[tuple[str, int]]:
    """(architecture, resolution) of every row a workflow config evaluates: its runs and the
    named checkpoints (a nulled row is not evaluated)."""
    ev = config["eval"]
    names = [*run_names, *(n for n, src in (ev.get("checkpoints") or {}).items() if src is not None)]
    shapes = set()
    for name in names:
        row = row_protocol(ev, name)
        if row.get("resolution"):
            shapes.add((eval_arch(row, config["mode"]), int(row["resolution"])))
    return shapes
