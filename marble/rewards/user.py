"""Rewards a user names in a config, by import path, without a line inside the package.

A workflow config's top-level `rewards:` list (or a YAML file's, for a command run by hand)
holds one entry per reward, with the descriptor's fields (marble.rewards.catalogue):

    rewards:
      - name: sharpness
        target: my_rewards.py:Sharpness   # or an importable "package.module:Class"
        flops: 2.0e6                      # per scored image (the plan); 0 is stated, never assumed
        modules: [scipy]                  # import names it needs (the doctor checks them)

Why an environment variable: `marble.rewards.register` lasts one process, and the workflow
starts many (train, evaluate, the summary, the report, the doctor). The Snakefile puts the
config's list, paths made absolute, in MARBLE_REWARDS; every process the jobs start inherits
it and the registry registers those rewards when it is imported. By hand, MARBLE_REWARDS
may name the YAML file instead (`MARBLE_REWARDS=mine.yaml marble evaluate ...`).
Torch-free: the registry imports this while Snakemake builds its DAG.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType

from marble.rewards.catalogue import Column, RewardDescriptor

ENV = "MARBLE_REWARDS"
# A run trained with a config's own rewards records them here, so `marble evaluate
# --checkpoint_path RUN` scores with them without MARBLE_REWARDS (run by hand, later).
RUN_FILE = "own_rewards.json"
# The keys a user's entry may set; the descriptor's others (replicas, judges, the paper's
# training set) describe the paper's scorers only.
KEYS = ("name", "target", "flops", "modules", "extra", "eval_datasets", "column")
COLUMN_KEYS = ("label", "position", "keys", "datasets", "scale", "places")
# A user's Table 1 column sits right of the paper's eight unless its `position` says otherwise.
_FIRST_POSITION = 100


class UserRewardError(ValueError):
    """A config's reward entry is malformed; the message names the entry and the key."""


def _strings(value, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise UserRewardError(f"{where}: a list of names, got {value!r}")
    return tuple(value)


def _target(value, where: str, root: Path) -> str:
    """`module:Class`, or `file.py:Class` with the file made absolute against `root`."""
    if not isinstance(value, str) or value.count(":") != 1 or not all(value.split(":")):
        raise UserRewardError(f"{where}.target: 'module:Class' or 'path/file.py:Class', got {value!r}")
    module, cls = value.split(":")
    if module.endswith(".py"):
        module = str((root / module).resolve())
    return f"{module}:{cls}"


def _column(value, name: str, index: int, where: str) -> Column:
    if not isinstance(value, dict):
        raise UserRewardError(f"{where}.column: a mapping ({', '.join(COLUMN_KEYS)}), got {value!r}")
    unknown = sorted(set(value) - set(COLUMN_KEYS))
    if unknown:
        raise UserRewardError(f"{where}.column.{unknown[0]}: unknown key (known: {', '.join(COLUMN_KEYS)})")
    return Column(label=str(value.get("label", name)), position=int(value.get("position", _FIRST_POSITION + index)),
                  keys=_strings(value.get("keys", [name]), f"{where}.column.keys"),
                  datasets=_strings(value.get("datasets", ["pickscore", "drawbench"]), f"{where}.column.datasets"),
                  scale=float(value.get("scale", 1.0)), places=int(value.get("places", 3)))


def descriptor_of(entry, index: int, root: Path, where: str = "rewards") -> RewardDescriptor:
    """One config entry as a descriptor; a missing or unknown key is one line naming it."""
    where = f"{where}[{index}]"
    if not isinstance(entry, dict):
        raise UserRewardError(f"{where}: a mapping with {', '.join(KEYS)}, got {entry!r}")
    unknown = sorted(set(entry) - set(KEYS))
    if unknown:
        raise UserRewardError(f"{where}.{unknown[0]}: unknown key (known: {', '.join(KEYS)})")
    name = entry.get("name")
    if not isinstance(name, str) or not name.isidentifier():
        raise UserRewardError(f"{where}.name: a reward name (letters, digits, _), got {name!r}")
    where = f"{where} ({name})"
    flops = entry.get("flops")
    if isinstance(flops, bool) or not isinstance(flops, (int, float)) or not flops >= 0:
        # required: the plan prices every reward, and an unknown cost is never 0
        raise UserRewardError(f"{where}.flops: FLOPs per scored image, a number >= 0 (required), got {flops!r}")
    column = entry.get("column")
    return RewardDescriptor(
        name, _target(entry.get("target"), where, root), flops=float(flops),
        modules=_strings(entry.get("modules", []), f"{where}.modules"), extra=str(entry.get("extra", "")),
        doctor_rows=("build",),  # the doctor builds it: a broken constructor fails before any job
        eval_datasets=_strings(entry.get("eval_datasets", []), f"{where}.eval_datasets"),
        column=None if column is None else _column(column, name, index, where))


def descriptors_of(entries, root: Path, where: str = "rewards") -> list[RewardDescriptor]:
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise UserRewardError(f"{where}: a list of rewards, got {type(entries).__name__}")
    return [descriptor_of(entry, i, root, where) for i, entry in enumerate(entries)]


def from_env(value: str | None = None) -> list[RewardDescriptor]:
    """The rewards MARBLE_REWARDS holds: a JSON list (the workflow's), or a YAML file's `rewards:`
    (relative targets against that file's folder)."""
    value = os.environ.get(ENV, "") if value is None else value
    if not value.strip():
        return []
    if value.lstrip().startswith("["):
        try:
            return descriptors_of(json.loads(value), Path.cwd(), ENV)
        except json.JSONDecodeError as exc:
            raise UserRewardError(f"{ENV}: not a JSON list ({exc.msg})") from None
    import yaml

    path = Path(value)
    if not path.is_file():
        raise UserRewardError(f"{ENV}={value}: no such file (a config file with a `rewards:` list)")
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise UserRewardError(f"{ENV}={value}: a mapping with a `rewards:` list")
    return descriptors_of(data.get("rewards"), path.resolve().parent, f"{path}: rewards")


def export(entries, root: Path | str = ".") -> str:
    """The config's `rewards:` as MARBLE_REWARDS' JSON, targets absolute (jobs run anywhere)."""
    found = descriptors_of(entries, Path(root))
    return json.dumps([{**entry, "target": d.target} for entry, d in zip(entries, found)], sort_keys=True)


def install(entries, root: Path | str = ".") -> list[RewardDescriptor]:
    """Put the config's rewards in MARBLE_REWARDS for every child process and return them for the
    caller to register (`marble.rewards.register_config`: the Snakefile and the doctor)."""
    if not entries:
        return []
    os.environ[ENV] = export(entries, root)
    return from_env()


def entry_of(d: RewardDescriptor) -> dict:
    """A descriptor as a config entry (targets already absolute): what a run folder records."""
    entry = {"name": d.name, "target": d.target, "flops": d.flops, "modules": list(d.modules),
             "extra": d.extra, "eval_datasets": list(d.eval_datasets)}
    if d.column is not None:
        c = d.column
        entry["column"] = {"label": c.label, "position": c.position, "keys": list(c.keys),
                           "datasets": list(c.datasets), "scale": c.scale, "places": c.places}
    return entry


def record_in_run(out_dir: Path | str) -> Path | None:
    """RUN/own_rewards.json of the config's own rewards this process trains with (None: none)."""
    found = from_env()
    if not found:
        return None
    path = Path(out_dir) / RUN_FILE
    path.write_text(json.dumps([entry_of(d) for d in found], indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return path


def from_run(run: Path | str) -> list[RewardDescriptor]:
    """The own rewards a run folder recorded (none when it has no RUN_FILE)."""
    path = Path(run) / RUN_FILE
    if not path.is_file():
        return []
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UserRewardError(f"{path}: unreadable ({exc})") from None
    return descriptors_of(entries, path.parent, str(path))


def load_module(path: str) -> ModuleType:
    """The module of a `file.py` target, imported once under a name made from its path."""
    key = "marble_user_reward_" + "".join(c if c.isalnum() else "_" for c in path)
    if key in sys.modules:
        return sys.modules[key]
    if not Path(path).is_file():
        raise ModuleNotFoundError(f"reward file {path} does not exist", name=path)
    spec = importlib.util.spec_from_file_location(key, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module  # before exec: the module may import itself (dataclasses, pickling)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[key]
        raise
    return module
