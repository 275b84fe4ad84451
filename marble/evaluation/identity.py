"""An evaluation's identity by content: the base model's and the LoRA's fingerprints.

`marble evaluate` used to compare `model_path` and an absolute checkpoint path as
strings: a base model replaced at the same path resumed from the old rows (the old score
was reported as current), and a moved or copied project refused its own finished
evaluation. Here both are `{"path": <relative to the project>, "fingerprint": ...}`
(marble.runtime.fingerprint), or `{"ref": ...}` for a hub id, `random:` model or hub
LoRA at a commit; results.check_same_run compares what they hold, never where they lie.
A LoRA from a marble run folder must also have been trained on this base: the run's
inputs.json records its base model's fingerprint (marble.training.inputs). Copied out of its
run, a checkpoint folder still says so (its identity.json) and so does its `lora/` alone (the
weights file's metadata, marble.models.lora.lora_provenance): a mismatch is refused in one
line unless `allow_other_base` (`marble evaluate --allow_other_base`) says it is meant.
"""

from __future__ import annotations

from pathlib import Path

from marble.evaluation.checkpoints import CheckpointError
from marble.runtime.fingerprint import HashCache, fingerprint, project_relative
from marble.training.inputs import model_entry, recorded_inputs
from marble.training.preflight import unreadable_weights
from marble.training.checkpoint_format import is_marble_checkpoint, read_identity
from marble.training.run_dir import TrainError

# The named override of a base refusal (marble evaluate's flag).
ALLOW_OTHER_BASE = "--allow_other_base"


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
            f"{base.get('fingerprint') or base.get('ref')}; evaluate it with its own base model, or pass "
            f"{ALLOW_OTHER_BASE} to evaluate it on this one on purpose")


def _is_content(value: str) -> bool:
    return value.startswith(("tree:", "sha256:"))


def same_base(recorded: str, now: str) -> bool:
    """Whether a recorded base (a content fingerprint, or a hub id / `random:` reference) is the
    one evaluated; a folder's fingerprint and a hub id cannot be compared (a local copy of a hub
    model is both), so they pass."""
    if _is_content(recorded) and _is_content(now):
        return recorded == now
    if not _is_content(recorded) and not _is_content(now):
        return recorded.split("@")[0] == now.split("@")[0]
    return True


def recorded_base(lora_dir: Path | None, checkpoint: str | None) -> tuple[str, str] | None:
    """(base fingerprint, where it is recorded) of a LoRA outside its run folder: its checkpoint
    folder's identity.json, else its weights file's provenance metadata; None when neither."""
    from marble.models.lora import lora_provenance  # torch: only when a LoRA is evaluated

    folder = Path(checkpoint) if checkpoint and Path(checkpoint).is_dir() else None
    if folder is not None and is_marble_checkpoint(folder):
        identity = read_identity(folder)
        if identity and identity.get("base"):
            return identity["base"], str(folder / "identity.json")
    if lora_dir is not None and Path(lora_dir).is_dir():
        provenance = lora_provenance(lora_dir)
        if provenance and provenance.get("base"):
            return provenance["base"], f"{lora_dir} (its weights' metadata)"
    return None


def check_recorded_base(lora_dir: Path | None, checkpoint: str | None, base: dict,
                        allow_other_base: bool = False) -> None:
    """Refuse a LoRA whose own record names another base than the one evaluated."""
    found = recorded_base(lora_dir, checkpoint)
    now = base.get("fingerprint") or base.get("ref")
    if found is None or not now or allow_other_base or same_base(found[0], now):
        return
    raise CheckpointError(
        f"--checkpoint_path {checkpoint or lora_dir}: trained on base {found[0]} (recorded in {found[1]}), "
        f"but --model_path {base.get('path') or base.get('ref')} holds {now}; evaluate it with its own "
        f"base model, or pass {ALLOW_OTHER_BASE} to evaluate it on this one on purpose")


def content_identity(model_path: str, lora_dir, checkpoint: str | None,
                     allow_other_base: bool = False) -> tuple[dict, dict | None]:
    """(base model entry, LoRA entry) of one evaluation; refuses a LoRA of another base (its
    run folder's inputs.json, or its own record outside one) unless `allow_other_base`."""
    cache = HashCache()
    base = base_entry(model_path, cache)
    if not allow_other_base:
        check_lora_base(checkpoint, base)
    check_recorded_base(lora_dir, checkpoint, base, allow_other_base)
    return base, lora_entry(lora_dir, checkpoint, cache)
