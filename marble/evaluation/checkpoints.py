"""Resolve `--checkpoint_path` to the LoRA folder to load.

Accepted, in this order:
1. a marble checkpoint folder (has `lora/`, as written by `marble.training.checkpoint.save_checkpoint`;
   the reference's `<ckpt>/lora` peft folders have the same shape): one marble wrote (a
   `COMPLETE` marker or `state.pt`) must be usable (marble.training.checkpoint_format: the
   definition training resumes by), else an error naming the damaged files;
2. a marble run folder (has `checkpoints/`): its newest usable checkpoint (damaged ones are
   skipped with a warning, as resume skips them);
3. a LoRA folder itself: peft (`adapter_config.json` + `adapter_model.safetensors`, or the
   `adapter_model.bin` older peft and the reference's hub LoRAs ship, read with
   `torch.load(weights_only=True)`) or diffusers (`pytorch_lora_weights.safetensors`).
Anything else is an error that says what was looked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from marble.assets import hub_ref as hub_refs
from marble.assets.download import DownloadError
from marble.assets.hub import snapshot
from marble.assets.hub_ref import HUB_PREFIX, hub_ref

from marble.training.checkpoint_format import (
    CheckpointError,
    damaged_files,
    is_marble_checkpoint,
    latest_usable,
)

# safetensors first; a .bin is only ever read with weights_only=True (no arbitrary pickles).
PEFT_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
DIFFUSERS_WEIGHTS = ("pytorch_lora_weights.safetensors",)


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
    latest = latest_usable(run_dir)
    if latest is None:
        raise CheckpointError(
            f"{run_dir} is a marble run folder but {run_dir / 'checkpoints'} holds no usable "
            "checkpoint (a checkpoint-NNNNNN folder whose COMPLETE marker's sha256 match its files)"
        )
    return latest


def _check_usable(folder: Path) -> None:
    damaged = damaged_files(folder)
    if damaged:
        raise CheckpointError(f"--checkpoint_path {folder} is a damaged marble checkpoint: "
                              f"{', '.join(damaged)}")


def resolve_lora(path: str | Path) -> ResolvedLora:
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"--checkpoint_path {path} does not exist")
    checkpoint = path
    if not (path / "lora").is_dir() and (path / "checkpoints").is_dir():
        checkpoint = _latest_in_run(path)
    elif is_marble_checkpoint(path):
        _check_usable(path)
    elif path.name == "lora" and is_marble_checkpoint(path.parent):  # its `lora/` named directly
        _check_usable(path.parent)
    for candidate in (checkpoint / "lora", checkpoint):
        kind = lora_kind(candidate)
        if kind is not None:
            return ResolvedLora(candidate, kind, checkpoint)
    raise CheckpointError(
        f"--checkpoint_path {path} is neither a marble checkpoint (a `lora/` subfolder with LoRA "
        "weights), a marble run folder (`checkpoints/checkpoint-N/`), nor a LoRA folder (peft: "
        f"adapter_config.json + {' or '.join(PEFT_WEIGHTS)}; diffusers: {DIFFUSERS_WEIGHTS[0]})"
    )


def resolve_checkpoint(args):
    """(LoRA to load or None, checkpoint description for run_info) of `marble evaluate`'s
    `--checkpoint_path` (a run, a checkpoint or a LoRA folder) or `--lora_hf_path` (a local
    folder or `[hf:]<repo id>[@revision]`)."""
    if args.checkpoint_path:
        resolved = resolve_lora(args.checkpoint_path)
        return resolved.lora_dir, str(resolved.checkpoint.resolve())
    if args.lora_hf_path:
        local = Path(args.lora_hf_path).expanduser()
        if not args.lora_hf_path.startswith(HUB_PREFIX) and local.is_dir():
            return local, str(local.resolve())
        repo_id, revision = parse_hub_ref(args.lora_hf_path)
        folder = download_hub_lora(repo_id, revision)
        # The snapshot folder is named by its commit: the identity pins what was evaluated,
        # so a branch that moved between two runs is refused rather than mixed.
        commit = folder.name if folder.parent.name == "snapshots" else revision
        return resolve_lora(folder).lora_dir, hub_ref(repo_id, commit)
    return None, None


def parse_hub_ref(value: str) -> tuple[str, str | None]:
    """`[hf:]<repo id>[@revision]` -> (repo id, revision or None), as a CheckpointError."""
    try:
        return hub_refs.parse_hub_ref(value)
    except hub_refs.HubRefError as exc:
        raise CheckpointError(str(exc)) from None


def download_hub_lora(repo_id: str, revision: str | None) -> Path:
    """The LoRA repo's local snapshot (marble.assets.hub.snapshot: the huggingface_hub cache,
    HF_ENDPOINT, HF_TOKEN, retried on transient errors). With HF_HUB_OFFLINE=1 (compute
    nodes) it is read from the cache only. A revision should be a commit hash: a branch or
    tag may move between runs."""

    try:  # a LoRA repo is small: fetch it whole, then load it like a local folder
        return snapshot(repo_id, revision)
    except DownloadError as exc:
        raise CheckpointError(
            f"hub LoRA {hub_ref(repo_id, revision)}: {exc}; on an offline node fetch it first "
            f"(`python -m marble.assets.hub {hub_ref(repo_id, revision)} --out DIR`) "
            "or pass a local folder") from exc
