"""An evaluation's identity by content: the base model's and the LoRA's fingerprints.

`marble evaluate` used to compare `model_path` and an absolute checkpoint path as
strings: a base model replaced at the same path resumed from the old rows (the old score
was reported as current), and a moved or copied project refused its own finished
evaluation. Here both are `{"path": <relative to the project>, "fingerprint": ...}`
(marble.runtime.fingerprint), or `{"ref": ...}` for a hub id, `random:` model or hub
LoRA at a commit; results.check_same_run compares what they hold, never where they lie.
A LoRA from a marble run folder must also have been trained on this base: the run's
inputs.json records its base model's fingerprint (marble.training.inputs).
"""

from __future__ import annotations

from pathlib import Path

from marble.evaluation.checkpoints import CheckpointError
from marble.runtime.fingerprint import HashCache, fingerprint, project_relative
from marble.training.inputs import model_entry, recorded_inputs
from marble.training.preflight import unreadable_weights
from marble.training.run_dir import TrainError


def base_entry(model_path: str, cache: HashCache) -> dict:
    folder = Path(model_path).expanduser()
    damaged = unreadable_weights(folder) if folder.is_dir() else None
    if damaged:  # one line here, not a traceback from deep in from_pretrained
        raise CheckpointError(f"--model_path {model_path} does not load: {damaged}")
    return model_entry(model_path, None, cache)


def lora_entry(lora_dir: Path | None, checkpoint: str | None, cache: HashCache) -> dict | None:
    """The LoRA evaluated: its folder's fingerprint, or the hub reference (already a commit)."""
    if lora_dir is None:
        return None
    if checkpoint and not Path(checkpoint).exists():
        return {"ref": checkpoint}  # hf:<id>@<commit>
    return {"path": project_relative(checkpoint or lora_dir), "fingerprint": fingerprint(lora_dir, cache)}


def run_folder_of(checkpoint: str | None) -> Path | None:
    """The marble run folder a checkpoint belongs to (<run>/checkpoints/checkpoint-N)."""
    if not checkpoint:
        return None
    path = Path(checkpoint)
    if path.parent.name == "checkpoints" and (path.parent.parent / "config.yaml").is_file():
        return path.parent.parent
    return None


def check_lora_base(checkpoint: str | None, base: dict) -> None:
    """Refuse a LoRA whose run trained on another base model than the one evaluated."""
    run = run_folder_of(checkpoint)
    if run is None:
        return
    try:
        recorded = (recorded_inputs(run) or {}).get("model.path")
    except TrainError as exc:
        raise CheckpointError(str(exc)) from None
    if recorded is None:
        return  # a run from before inputs.json: nothing to compare with
    def content(entry):
        return {k: v for k, v in entry.items() if k != "path"}

    if content(recorded) != content(base):
        raise CheckpointError(
            f"--checkpoint_path {checkpoint}: its run {run} trained on base "
            f"{recorded.get('path') or recorded.get('ref')} ({recorded.get('fingerprint') or recorded.get('ref')}), "
            f"but --model_path {base.get('path') or base.get('ref')} holds "
            f"{base.get('fingerprint') or base.get('ref')}; evaluate it with its own base model")


def content_identity(model_path: str, lora_dir, checkpoint: str | None) -> tuple[dict, dict | None]:
    """(base model entry, LoRA entry) of one evaluation; refuses a LoRA of another base."""
    cache = HashCache()
    base = base_entry(model_path, cache)
    check_lora_base(checkpoint, base)
    return base, lora_entry(lora_dir, checkpoint, cache)
