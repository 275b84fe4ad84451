"""Workflow configs as overlays: a config naming `overlay_on: <file>` is merged over that file.

    python -m marble.workflow.configs config/table1.yaml [site.yaml ...] > config.yaml

config/eval.yaml holds Table 1's rows and their protocols once; config/paper.yaml,
config/table1.yaml and config/paper-eval.yaml say `overlay_on: config/eval.yaml`. Snakemake
merges several --configfile files in order; this puts the named base beneath the merged
result, so `--configfile config/paper.yaml` alone is complete (it cannot fall back to the
schema's default eval protocol, the tiny one) and the base may also be passed explicitly
(merging it twice changes nothing). The command above writes the composed config for DVC,
whose params then see every key in config.yaml. A config's `hub_lock:` file (marble hub lock)
fills its PIN-A-COMMIT references here. Torch-free (the DAG build imports it).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import yaml

from marble.config_parse import load_yaml
from marble.workflow import hub_lock
from marble.workflow.doctor_checks import merge

OVERLAY_KEY = "overlay_on"


def read_yaml(path: Path) -> dict:
    """A config file's mapping; a missing or non-mapping file is one clear line."""
    try:
        data = load_yaml(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SystemExit(f"error: config file {path} does not exist") from None
    except yaml.YAMLError as exc:  # where the YAML breaks, on one line (not a traceback)
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise SystemExit(f"error: {path}{where}: not valid YAML ({getattr(exc, 'problem', None) or exc})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SystemExit(f"error: {path}: a workflow config is a mapping, not {type(data).__name__}")
    return data


def compose(config: dict, root: Path | str = ".", apply_hub_lock: bool = True) -> dict:
    """`config` merged over its `overlay_on:` base (a path relative to `root`), the key gone;
    then the hub lock its `hub_lock:` names (relative to `root`) applied and that key gone
    (`apply_hub_lock=False`, for `marble hub lock` itself: the key stays, nothing applied).

    A config without the keys comes back as it is (a copy). A base is complete by itself: it
    may not name a base of its own (one level keeps the composition readable)."""
    out = copy.deepcopy(config)
    base_name = out.pop(OVERLAY_KEY, None)
    if base_name is not None:
        base_path = Path(root) / str(base_name)
        base = read_yaml(base_path)
        if OVERLAY_KEY in base:
            raise SystemExit(f"error: {base_path}: `{OVERLAY_KEY}:` in a base config (overlays nest one level)")
        out = merge(copy.deepcopy(base), out)
    if apply_hub_lock and hub_lock.LOCK_KEY in out:
        lock_name = out.pop(hub_lock.LOCK_KEY)
        if lock_name is not None:
            hub_lock.apply_lock(out, hub_lock.read_lock(Path(root) / str(lock_name)))
    return out


def compose_in_place(config: dict, root: Path | str = ".") -> None:
    """For the Snakefile, whose `config` is a global dict the rules already hold."""
    composed = compose(config, root)
    config.clear()
    config.update(composed)


def load(files: list, root: Path | str = ".", apply_hub_lock: bool = True) -> dict:
    """The files merged in order (Snakemake's --configfile merge), then composed."""
    merged: dict = {}
    for path in files:
        merge(merged, read_yaml(Path(root) / path))
    return compose(merged, root, apply_hub_lock)


def main(argv: list[str] | None = None) -> int:
    files = sys.argv[1:] if argv is None else argv
    if not files or files[0].startswith("-"):
        print(__doc__.splitlines()[2].strip(), file=sys.stderr)
        return 2
    sys.stdout.write(f"# composed by marble.workflow.configs from {' '.join(files)}\n")
    sys.stdout.write(yaml.safe_dump(load(files), sort_keys=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
