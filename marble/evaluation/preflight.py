"""`marble evaluate`'s paths checked before anything loads: one line naming the flag, never a traceback.

An --output_dir that is a file (or lies under one) failed on the lock's mkdir with a
FileExistsError traceback; a --model_path that names no folder failed after the scorers
loaded (or, for a bare name, with diffusers' hub traceback). Both are refused here, first.
"""

from __future__ import annotations

from pathlib import Path

RANDOM_PREFIX = "random:"  # marble.models.loading's in-memory models (that module imports torch)


def output_dir_problem(output_dir: str | Path) -> str | None:
    """Why --output_dir cannot be the evaluation's folder (it or a parent is a file), or None."""
    path = Path(output_dir).expanduser()
    for folder in (path, *path.parents):
        if folder.exists():
            if folder.is_dir():
                return None
            which = "is a file" if folder == path else f"lies under the file {folder}"
            return f"--output_dir {output_dir} {which}, not a folder: pass another --output_dir"
    return None


def is_hub_id(value: str) -> bool:
    """`owner/name`: what diffusers may fetch from the hub (a path has another shape)."""
    parts = value.split("/")
    return len(parts) == 2 and all(parts) and not value.startswith((".", "~")) and "\\" not in value


def model_path_problem(model_path: str, model_type: str = "sd3") -> str | None:
    """Why --model_path names no base model, or None: a folder that does not exist (or is a
    file), or a bare name that is neither a folder nor a hub id. A hub id is checked when it loads."""
    if model_path.startswith(RANDOM_PREFIX):
        return None
    path = Path(model_path).expanduser()
    if path.is_dir():
        return None
    if path.exists():
        return f"base model {model_path} is a file, not a model folder: pass --model_path a folder"
    if is_hub_id(model_path) and model_type == "sd3":
        return None
    return (f"base model {model_path} not found: pass --model_path a model folder "
            f"(`marble models tiny --out DIR` builds a tiny one), a hub id owner/name or random:tiny")


def path_problem(args) -> str | None:
    """`marble evaluate`'s --output_dir and --model_path checked before any load (a rescore,
    --skip_generation, never loads the model)."""
    problem = output_dir_problem(args.output_dir)
    if problem is None and not args.skip_generation:
        problem = model_path_problem(args.model_path, args.model_type)
    return problem
