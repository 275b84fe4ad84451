"""A run folder's identity: which config keys may change on resume, and the refusal when others do.

DIR/config.yaml holds the resolved config of the run that created DIR. Resuming into DIR with
a config that differs on a key that changes the result would silently mix two experiments,
so `check_run_dir` refuses it (TrainError, one line naming every differing key with both
values). The keys in RESULT_NEUTRAL_KEYS change how long or how often, not what is computed.
Both the CLI (`marble.train`, before any heavy import) and `run_training` (for library
callers) run the check. Where the user asks for a new run in the same folder instead
(`marble train --fresh`), `set_aside` renames the old one to a hidden, timestamped sibling:
one atomic rename, nothing deleted.
"""

from __future__ import annotations

import hashlib
import json
import os
from datetime import datetime, timezone
from pathlib import Path

import yaml

from marble.config import RunConfig, dump_yaml
from marble.runtime.io import fsync_dir
from marble.training.checkpoint_format import CheckpointError, list_checkpoints, read_identity

# Keys that may differ between a run folder's config.yaml and a resumed invocation:
# they change how long / how often, not what is computed.
RESULT_NEUTRAL_KEYS = {
    "preset", "train.max_steps", "train.save_every", "train.log_every", "train.keep_checkpoints",
    "sampling.eval_num_steps", "data.test", "data.embed_cache",
    # The held-out evaluation's settings: what it measures, not what training computes; every
    # eval.jsonl line records them (`eval_id`, marble.training.heldout).
    "train.eval_every", "train.eval_images_per_prompt", "train.eval_max_prompts", "sampling.eval_solver",
    "logging.backends",  # trackers watch a run; a folder from before the key resumes too
}
# Keys holding file or folder paths: compared resolved on resume, so `data/x` and its
# absolute spelling are the same run, not a config change.
PATH_KEYS = {"model.path", "data.train", "data.test", "data.embed_cache"}


# What every refusal of a run folder offers besides restoring it (marble train's flag).
FRESH_HINT = "--fresh to keep this run aside (renamed, not deleted) and start over"


# The named override of a checkpoint-identity refusal (`marble train`'s flag): continuing a
# run from a checkpoint of another run is sometimes meant (a warm start), never silent.
ADOPT_FLAG = "--adopt-checkpoint"


class TrainError(RuntimeError):
    """A user-facing problem (bad folder, mismatched config); one clear line."""


def flat_config(d: dict, prefix: str = "") -> dict:
    """Nested config dict -> {dotted key: value}; a reward's `options` mapping stays one value."""
    out = {}
    for key, value in d.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and key != "options":
            out.update(flat_config(value, path + "."))
        else:
            out[path] = value
    return out


def comparable(key: str, value):
    """A value as resume compares it: path keys resolved against the working folder."""
    if key in PATH_KEYS and isinstance(value, str) and value and not value.startswith("random:"):
        return str(Path(value).expanduser().resolve())
    return value


def _defaults() -> dict:
    """Every key's default, flat (marble.config's dataclasses)."""
    return flat_config(yaml.safe_load(dump_yaml(RunConfig())))


def config_differences(saved: dict, wanted: dict, by_content: frozenset = frozenset()) -> list[str]:
    """Keys (dotted) whose values differ and that change the result. `by_content`: path
    keys whose content the run folder's inputs.json records (marble.training.inputs
    compares those by fingerprint, so a moved or copied project resumes).

    A key the run folder's config.yaml lacks was added to marble after the folder was
    written; a new key's default is the behaviour before it (the rule for adding one), so
    the folder holds the default and a run asking for the default resumes it."""
    a, b = flat_config(saved), flat_config(wanted)
    if set(b) - set(a):
        defaults = _defaults()
        a.update({k: defaults[k] for k in set(b) - set(a) if k in defaults})
    keys = sorted(set(a) | set(b))
    return [k for k in keys if k not in RESULT_NEUTRAL_KEYS and k not in by_content
            and comparable(k, a.get(k, "<absent>")) != comparable(k, b.get(k, "<absent>"))]


def config_digest(cfg: RunConfig) -> str:
    """sha256 of the keys that determine the result: every key but RESULT_NEUTRAL_KEYS and the
    PATH_KEYS (compared by content instead: the base's and the table's fingerprints), and only
    those away from their default, so a key added to marble later (its default is the
    behaviour before it) leaves the digest of an older run unchanged."""
    flat, defaults = flat_config(yaml.safe_load(dump_yaml(cfg))), _defaults()
    missing = object()
    kept = {k: v for k, v in flat.items() if k not in RESULT_NEUTRAL_KEYS and k not in PATH_KEYS
            and defaults.get(k, missing) != v}
    return "sha256:" + hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()


def run_identity(cfg: RunConfig, inputs: dict[str, dict]) -> dict:
    """What a checkpoint records of its run: the config digest, the base model's and the
    training table's content fingerprints (marble.training.inputs entries; a hub id or
    `random:` model by its reference) and the seed."""
    def content(key: str):
        entry = inputs.get(key) or {}
        return entry.get("fingerprint") or entry.get("ref")

    return {"config": config_digest(cfg), "base": content("model.path"),
            "train_table": content("data.train"), "seed": int(cfg.train.seed)}


def identity_differences(saved: dict, now: dict) -> list[str]:
    """`key: <saved> in the checkpoint, <now> in this run` for each field that differs."""
    return [f"{k} {saved.get(k, '<absent>')} in the checkpoint, {now.get(k, '<absent>')} in this run"
            for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)]


# A run folder's identity files (config.yaml: marble.training.run; inputs.json: marble.training.inputs).
IDENTITY_FILES = ("config.yaml", "inputs.json")


def identity_refusal(path: Path, diffs: list[str]) -> str:
    """The one line refusing checkpoint `path` of another run identity (the manager's and preflight's)."""
    return (f"{path} is a checkpoint of another run: {'; '.join(diffs)}. Resume it in its own run "
            f"folder, train into another --output-dir, or pass {ADOPT_FLAG} to continue from it on purpose")


def check_checkpoint_identities(out_dir: Path, identity: dict, adopt: bool = False) -> None:
    """Before anything is written (preflight): every checkpoint of the folder that records a run
    identity must record this one (the manager checks the one it loads again)."""
    if adopt:
        return
    for _, path in reversed(list_checkpoints(out_dir)):
        try:
            saved = read_identity(path)
        except CheckpointError:
            continue  # damaged: resume skips it with a warning naming it
        diffs = identity_differences(saved, identity) if saved is not None else []
        if diffs:
            raise TrainError(identity_refusal(path, diffs))


def check_identity_files(out_dir: Path, adopt: bool = False) -> None:
    """Refuse a run folder that holds checkpoints but lost config.yaml or inputs.json (a partial
    restore, `dvc checkout --force` under a running trainer): without them nothing said which
    run the checkpoints belong to, and a resume with another config adopted them. Checkpoints
    that record their run's identity are compared on load instead (CheckpointManager);
    `adopt` (ADOPT_FLAG) takes identity-less ones as this config's run: the migration of a
    folder from before identities."""
    missing = [name for name in IDENTITY_FILES if not (Path(out_dir) / name).is_file()]
    found = list_checkpoints(out_dir) if missing else []
    if not found or adopt:
        return
    try:
        recorded = read_identity(found[-1][1])
    except CheckpointError:
        recorded = None
    if recorded is not None:
        return
    raise TrainError(
        f"{out_dir} holds {len(found)} checkpoint(s) but no {' and no '.join(missing)}: nothing says "
        f"which run they belong to. Restore the folder's files (e.g. `dvc checkout` of its stage), "
        f"pass {ADOPT_FLAG} to take its checkpoints as this config's run, or {FRESH_HINT}")


def check_run_dir(out_dir: Path, cfg: RunConfig, adopt: bool = False) -> None:
    """Refuse a run folder whose config.yaml disagrees with `cfg` on keys that matter, or that
    holds checkpoints without its identity files (check_identity_files)."""
    check_identity_files(Path(out_dir), adopt)
    saved_path = Path(out_dir) / "config.yaml"
    if not saved_path.is_file():
        check_max_steps(out_dir, cfg)
        return
    try:
        saved = yaml.safe_load(saved_path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise TrainError(f"{saved_path}: unreadable config ({exc})") from exc
    # Round-trip through YAML so tuples/lists and floats compare like the saved file.
    wanted = yaml.safe_load(dump_yaml(cfg))
    diff = config_differences(saved, wanted, content_checked_keys(out_dir))
    if diff:
        # Every differing key with both values: the saved run's and the requested one.
        old, new = flat_config(saved), flat_config(wanted)
        shown = "; ".join(f"{k}: {old.get(k, '<absent>')!r} in the run folder, "
                          f"{new.get(k, '<absent>')!r} requested" for k in diff)
        raise TrainError(
            f"{saved_path} was written by a different training config; differing keys: "
            f"{shown}. Use the same config (only {', '.join(sorted(RESULT_NEUTRAL_KEYS))} may "
            f"change on resume), another --output-dir, or {FRESH_HINT}."
        )
    check_max_steps(out_dir, cfg)


def content_checked_keys(out_dir: Path) -> frozenset:
    """PATH_KEYS whose fingerprint DIR/inputs.json records (its reader, marble.training.inputs,
    refuses changed content; only the file's keys are read here)."""
    try:
        recorded = yaml.safe_load((Path(out_dir) / "inputs.json").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return frozenset()
    if not isinstance(recorded, dict):
        return frozenset()
    return frozenset(k for k, v in recorded.items()
                     if k in PATH_KEYS and isinstance(v, dict) and v.get("fingerprint"))


def check_max_steps(out_dir: Path, cfg: RunConfig) -> None:
    """A run folder already past `train.max_steps` is an error, not a silent "done"."""
    steps = [step for step, _ in list_checkpoints(out_dir)]
    if steps and steps[-1] > cfg.train.max_steps:
        raise TrainError(
            f"{out_dir}: its last checkpoint is step {steps[-1]}, past `train.max_steps` = "
            f"{cfg.train.max_steps}; give max_steps >= {steps[-1]}, another --output-dir, or "
            f"{FRESH_HINT}")


class FolderWatch:
    """What the trainer wrote into its run folder and expects to find there: a file deleted
    under a running trainer (`dvc checkout --force` of a `persist: true` output, a cleanup
    script) is named by `lost()`, so the run stops non-zero instead of finishing as a folder
    without its identity, its logs or the checkpoint it resumes from."""

    def __init__(self, out_dir: Path):
        self.out_dir, self.names = Path(out_dir), {}

    def expect(self, role: str, path: Path) -> None:
        """`role` (one file per role: the newest checkpoint replaces the previous one) is at `path`."""
        self.names[role] = Path(path)

    def lost(self) -> list[str]:
        return [str(p.relative_to(self.out_dir)) if p.is_relative_to(self.out_dir) else str(p)
                for _, p in sorted(self.names.items()) if not p.exists()]


def set_aside(out_dir: Path, now: datetime | None = None) -> Path | None:
    """Rename a run folder that holds anything to `.<name>.replaced-<UTC time>` beside it
    (one rename: atomic, nothing deleted); that path, or None when there was nothing.
    Hidden, so the report and the workflow's scans do not take it for a current run.
    Only the folder's lock holder may call it (marble train takes the lock first)."""
    out_dir = Path(out_dir)
    if not out_dir.exists() and not out_dir.is_symlink():
        return None
    if out_dir.is_dir() and not out_dir.is_symlink() and not any(out_dir.iterdir()):
        return None
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
    aside = out_dir.with_name(f".{out_dir.name}.replaced-{stamp}")
    n = 1
    while aside.exists() or aside.is_symlink():  # two starts within a second
        n += 1
        aside = out_dir.with_name(f".{out_dir.name}.replaced-{stamp}-{n}")
    os.rename(out_dir, aside)
    fsync_dir(out_dir.parent)  # the rename outlives a crash
    return aside
