"""Resolve `--checkpoint_path` to the LoRA folder to load.

Accepted, in this order:
1. a marble checkpoint folder (has `lora/`, as written by `marble.training.checkpoint.save_checkpoint`;
   the reference's `<ckpt>/lora` peft folders have the same shape);
2. a marble run folder (has `checkpoints/`): its latest complete checkpoint;
3. a LoRA folder itself: peft (`adapter_config.json` + `adapter_model.safetensors`, or the
   `adapter_model.bin` older peft and the reference's hub LoRAs ship, read with
   `torch.load(weights_only=True)`) or diffusers (`pytorch_lora_weights.safetensors`).
Anything else is an error that says what was looked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# safetensors first; a .bin is only ever read with weights_only=True (no arbitrary pickles).
PEFT_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
DIFFUSERS_WEIGHTS = ("pytorch_lora_weights.safetensors",)


class CheckpointError(ValueError):
    """`--checkpoint_path` is not something we can load a LoRA from."""


@dataclass(frozen=True)
class ResolvedLora:
    lora_dir: Path  # the folder handed to load_lora_into_pipeline
    kind: str  # "peft" | "diffusers"
    checkpoint: Path  # the checkpoint folder it came from (== lora_dir for a bare LoRA)


def lora_kind(folder: Path) -> str | None:
    """'peft', 'diffusers' or None for a folder that holds no LoRA weights."""
    if not folder.is_dir():
        return None
    if (folder / "adapter_config.json").is_file() and any((folder / f).is_file() for f in PEFT_WEIGHTS):
        return "peft"
    if any((folder / f).is_file() for f in DIFFUSERS_WEIGHTS):
        return "diffusers"
    return None


def _latest_in_run(run_dir: Path) -> Path:
    from marble.training.checkpoint import latest_checkpoint

    latest = latest_checkpoint(run_dir)
    if latest is None:
        raise CheckpointError(
            f"{run_dir} is a marble run folder but {run_dir / 'checkpoints'} holds no complete "
            "checkpoint (a checkpoint-NNNNNN folder with a COMPLETE marker)"
        )
    return latest


def resolve_lora(path: str | Path) -> ResolvedLora:
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"--checkpoint_path {path} does not exist")
    checkpoint = path
    if not (path / "lora").is_dir() and (path / "checkpoints").is_dir():
        checkpoint = _latest_in_run(path)
    for candidate in (checkpoint / "lora", checkpoint):
        kind = lora_kind(candidate)
        if kind is not None:
            return ResolvedLora(candidate, kind, checkpoint)
    raise CheckpointError(
        f"--checkpoint_path {path} is neither a marble checkpoint (a `lora/` subfolder with LoRA "
        "weights), a marble run folder (`checkpoints/checkpoint-N/`), nor a LoRA folder (peft: "
        f"adapter_config.json + {' or '.join(PEFT_WEIGHTS)}; diffusers: {DIFFUSERS_WEIGHTS[0]})"
    )
