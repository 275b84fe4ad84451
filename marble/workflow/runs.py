"""A configured run (`runs: <name>: {preset, max_steps, set}`) as `marble train` sees it."""

from __future__ import annotations

import functools
import shlex

from marble.config import load_config
from marble.training import checkpoint_format


def configured(entries: dict | None) -> dict:
    """`runs:` or `eval.checkpoints:` without the entries set to null. A later --configfile
    merges into the earlier ones and cannot delete a key, so an overlay drops a row (a run
    not trained, a checkpoint not evaluated) by nulling it."""
    return {name: spec for name, spec in (entries or {}).items() if spec is not None}


def run_overrides(spec: dict, model_dir: str, dataset_dir: str, embed_dir: str | None) -> list[str]:
    """The `--set` overrides every run gets: this workflow's model and tables win, then the
    run's own `set:` entries."""
    sets = [f"model.path={model_dir}", f"data.train={dataset_dir}/train.parquet",
            f"data.test={dataset_dir}/test.parquet"]
    if embed_dir is not None:
        sets.append(f"data.embed_cache={embed_dir}")
    return sets + list(spec["set"])


def final_step(spec: dict, overrides: list[str]) -> int:
    """The last optimizer step of a run (its preset and overrides decide), so its final
    checkpoint's name is known before it exists."""
    overrides = list(overrides)
    if spec["max_steps"] is not None:
        overrides.append(f"train.max_steps={spec['max_steps']}")
    return _max_steps(spec["preset"], tuple(overrides))


@functools.lru_cache(maxsize=None)
def _max_steps(preset: str, overrides: tuple[str, ...]) -> int:
    # Memoized: Snakemake asks for every run's final checkpoint from many input functions
    # (642 calls in one tiny `snakemake -n report`, 21 of its 29 CPU seconds spent re-reading
    # preset YAML); presets do not change while one workflow invocation builds its DAG.
    return load_config(preset, overrides=list(overrides)).train.max_steps


def checkpoint_name(step: int) -> str:
    """The checkpoint folder name of an optimizer step (marble.training.checkpoint_format)."""
    return checkpoint_format.checkpoint_name(step)


def option(flag: str, value) -> str:
    """`flag VALUE` shell-quoted, or "" for an empty value (an optional input)."""
    value = " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value or "")
    return f"{flag} {shlex.quote(value)}" if value else ""


def train_args(spec: dict, overrides: list[str]) -> str:
    """`marble train` arguments after the preset and output dir, each shell-quoted."""
    args = [f"--set {shlex.quote(str(s))}" for s in overrides]
    if spec["max_steps"] is not None:
        args.append(f"--max-steps {int(spec['max_steps'])}")
    return " ".join(args)
