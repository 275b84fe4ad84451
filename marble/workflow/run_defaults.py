"""What `marble evaluate --checkpoint_path RUN --dataset D` takes from RUN and its project when a
flag is not given (flags always win):

- --model_path: the base the run trained on (RUN/inputs.json, else RUN/config.yaml);
- --data_dir: the project's prompt folder (its workflow config's `raw_dir`) when it holds D's
  prompt file, else the reference's `dataset/`;
- the protocol: when the project's workflow evaluates this run on this base (the resolved
  config of the last workflow run, results/preflight.config.json, else config.yaml), its
  eval protocol for the run: the rewards for D (eval.rewards.D, else the reference's for D),
  eval.reward_options and the image settings, so the command scores as `snakemake` does;
  otherwise the rewards the run trained on (already on this machine: no download).

Every refusal names the flag that fixes it. Torch-free.
"""

from __future__ import annotations

import json
from pathlib import Path

from marble.config_parse import load_yaml
from marble.evaluation.datasets import DEFAULT_REWARDS, PROMPT_FILES
import yaml

from marble.evaluation.run_record import (
    RunRecordError,
    project_root,
    recorded_base,
    run_folder,
    shown,
    training_rewards,
)
from marble.rewards import REGISTRY, register, user
from marble.workflow import evaluation as wf_eval

PROJECT_CONFIGS = ("results/preflight.config.json", "config.yaml")
# The image settings a protocol sets, as `marble evaluate` flags (resolution null: the flag's default).
PROTOCOL_FLAGS = ("num_inference_steps", "guidance_scale", "resolution", "mixed_precision", "numerics")
REFERENCE_DATA_DIR = "dataset"


def project_configs(root: Path) -> list[tuple[str, dict]]:
    """(file, workflow config) of the project, most recent first; unreadable ones are skipped
    (they only supply defaults, and the note says where each default came from)."""
    out = []
    for name in PROJECT_CONFIGS:
        path = root / name
        if not path.is_file():
            continue
        # Read directly, not through marble.workflow.configs/preflight: the evaluate stage of
        # dvc.yaml would then depend on the doctor's code. The snapshot is the resolved config
        # (overlays composed, schema defaults filled); config.yaml is taken as written.
        try:
            text = path.read_text(encoding="utf-8")
            config = json.loads(text).get("config") if name.endswith(".json") else load_yaml(text)
        except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError, AttributeError):
            continue
        if isinstance(config, dict) and isinstance(config.get("eval") or {}, dict):
            out.append((name, config))
    return out


def same_model(a: str, b: str) -> bool:
    return a == b or Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def protocol_for(config: dict, run_name: str, base: str, root: Path) -> dict | None:
    """The config's eval protocol for this run when it evaluates the run on the run's own base."""
    eval_cfg = config.get("eval") or {}
    try:
        row = wf_eval.row_protocol(eval_cfg, run_name)
        folder = wf_eval.model_folder(row, str(config.get("model_dir") or ""))
    except (ValueError, TypeError, AttributeError):
        return None
    model = folder if folder.startswith("random:") or Path(folder).is_absolute() else str(root / folder)
    return row if folder and same_model(model, base) else None


def protocol_values(row: dict, dataset: str) -> dict:
    values = {k: row[k] for k in PROTOCOL_FLAGS if row.get(k) is not None}
    values["rewards"] = ",".join((row.get("rewards") or {}).get(dataset) or DEFAULT_REWARDS[dataset])
    if row.get("reward_options"):
        values["reward_options"] = json.dumps(row["reward_options"], sort_keys=True)  # as the workflow passes it
    return values


def prompt_folder(root: Path, found: list[tuple[str, dict]], dataset: str) -> tuple[str, str]:
    """(--data_dir, where it came from): the first project raw_dir holding D's prompt file, else `dataset/`."""
    tried = []
    for name, config in found:
        raw = config.get("raw_dir")
        if isinstance(raw, str) and raw:
            folder = root / raw
            if (folder / dataset / PROMPT_FILES[dataset]).is_file():
                return shown(folder), f"{name} raw_dir"
            tried.append(f"{shown(folder / dataset / PROMPT_FILES[dataset])} ({name} raw_dir)")
    reference = Path(REFERENCE_DATA_DIR)
    if (reference / dataset / PROMPT_FILES[dataset]).is_file():
        return REFERENCE_DATA_DIR, "the reference's layout"
    tried.append(f"{reference / dataset / PROMPT_FILES[dataset]} (the reference's layout)")
    raise RunRecordError(f"evaluation prompts for {dataset} not found ({', '.join(dict.fromkeys(tried))}): "
                         "pass --data_dir")


def run_defaults(run: Path, dataset: str, given: set[str], model_path: str | None = None) -> tuple[dict, list[str]]:
    """(flag -> value for the flags not given, one note per default saying where it came from);
    `model_path`: the --model_path given (the protocol applies when the project evaluates it)."""
    root = project_root(run)
    found = project_configs(root)
    values: dict = {}
    notes: list[str] = []
    if "model_path" not in given:  # read only when needed: a flag never depends on the record
        base, where = recorded_base(run)
        values["model_path"] = base
        notes.append(f"--model_path {base} (the run's base, {where})")
    if "data_dir" not in given:
        values["data_dir"], source = prompt_folder(root, found, dataset)
        notes.append(f"--data_dir {values['data_dir']} ({source})")
    model = values.get("model_path") or model_path or ""
    row, name = next(((r, n) for n, c in found if (r := protocol_for(c, run.resolve().name, model, root))),
                     (None, None))
    if row is not None:
        for flag, value in protocol_values(row, dataset).items():
            if flag not in given:
                values[flag] = value
                notes.append(f"--{flag} {value} ({name} eval protocol of {run.resolve().name})")
    elif "rewards" not in given:
        values["rewards"] = ",".join(training_rewards(run))
        notes.append(f"--rewards {values['rewards']} (the rewards the run trained on)")
    return values, notes


def fill_from_run(args, given: set[str]) -> list[str]:
    """Set the flags `given` lacks on `args` from its --checkpoint_path's run folder (nothing for
    another checkpoint); the notes saying where each value came from."""
    run = run_folder(args.checkpoint_path) if args.checkpoint_path else None
    if run is None:
        return []
    try:  # the config's own rewards it trained with (RUN/own_rewards.json), unless named already
        own = [d for d in user.from_run(run) if d.name not in REGISTRY]
    except ValueError as exc:
        raise RunRecordError(f"{exc}; set {user.ENV}=<the config file naming its rewards>") from None
    for d in own:
        register(d)
    values, notes = run_defaults(run, args.dataset, given, args.model_path if "model_path" in given else None)
    for name, value in values.items():
        setattr(args, name, value)
    return notes
