"""What a marble run folder records that its evaluation needs: the run a --checkpoint_path
belongs to, the project it was trained in, its base model and its training rewards.

`marble evaluate --checkpoint_path RUN` used to default to SD3.5 Medium and the reference's
scorers whatever RUN was trained on; a run folder says both itself (inputs.json, config.yaml),
so scoring your own checkpoint needs no other flag (marble.workflow.run_defaults).
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from marble.config_parse import load_yaml

RUN_CONFIG = "config.yaml"
RUN_INPUTS = "inputs.json"  # marble.training.inputs.INPUTS_FILE (that module loads the trainer's config tree)


class RunRecordError(ValueError):
    """A run folder whose record cannot be read; the message names the file and the flag to pass."""


def is_run_folder(folder: Path) -> bool:
    return (folder / RUN_CONFIG).is_file() and (folder / "checkpoints").is_dir()


def run_folder(checkpoint_path: str | Path) -> Path | None:
    """The run folder of RUN, RUN/checkpoints/checkpoint-N or RUN/checkpoints/checkpoint-N/lora; None
    for anything else (a bare LoRA, a hub reference)."""
    path = Path(checkpoint_path).expanduser()
    if is_run_folder(path):
        return path
    checkpoint = path.parent if path.name == "lora" else path
    if checkpoint.parent.name == "checkpoints" and is_run_folder(checkpoint.parent.parent):
        return checkpoint.parent.parent
    return None


def project_root(run: Path) -> Path:
    """Where the run's relative paths start: the project holding results/runs/<run> (the workflow's
    layout), else the working folder (a run trained by hand)."""
    resolved = run.resolve()
    if resolved.parent.name == "runs" and resolved.parent.parent.name == "results":
        return resolved.parents[2]
    return Path.cwd()


def shown(path: Path) -> str:
    """A path as the user would type it: relative to the working folder when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve())) or "."
    except ValueError:
        return str(path)


def run_config(run: Path) -> dict:
    path = run / RUN_CONFIG
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0]
        raise RunRecordError(f"{path}: unreadable ({first}); pass --model_path and --rewards") from None
    if not isinstance(data, dict):
        raise RunRecordError(f"{path}: not a run config (a mapping); pass --model_path and --rewards")
    return data


def _recorded_inputs(run: Path) -> dict:
    path = run / RUN_INPUTS
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise RunRecordError(f"{path}: unreadable ({exc}); pass --model_path") from None
    return data if isinstance(data, dict) else {}


def recorded_base(run: Path) -> tuple[str, str]:
    """(the run's base model, where it is recorded): inputs.json's path (what the trainer
    fingerprinted), else config.yaml's model.path; a relative path is joined to the project."""
    entry = _recorded_inputs(run).get("model.path")
    if isinstance(entry, dict) and isinstance(entry.get("path"), str):
        value, where = entry["path"], run / RUN_INPUTS
    else:
        value = (run_config(run).get("model") or {}).get("path")
        where = run / RUN_CONFIG
        if not isinstance(value, str) or not value:
            raise RunRecordError(f"{where}: no model.path recorded; pass --model_path")
    if value.startswith("random:") or Path(value).expanduser().is_absolute():
        return value, shown(where)
    local = project_root(run) / value
    if not local.exists() and value.count("/") == 1 and not value.startswith((".", "~")):
        return value, shown(where)  # a hub id the run trained from
    return shown(local), shown(where)


def training_rewards(run: Path) -> list[str]:
    """The reward names the run trained on (its config.yaml `rewards:`)."""
    rewards = run_config(run).get("rewards") or []
    names = [r.get("name") for r in rewards if isinstance(r, dict)]
    if not names or not all(isinstance(n, str) for n in names):
        raise RunRecordError(f"{run / RUN_CONFIG}: no reward names under `rewards:`; pass --rewards")
    return names
