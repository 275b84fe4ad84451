"""A run's inputs by content: DIR/inputs.json, written at the start, checked on every resume.

config.yaml says which inputs a run was given by path; inputs.json says what those paths
held (marble.runtime.fingerprint), so a base model, a training table or reward weights
replaced under the same path are refused on resume with a line naming the key, the path
and both fingerprints, and a moved or copied project (other absolute paths, same
content) resumes. Entries:

    {"model.path": {"path": "data/models/tiny-sd3", "fingerprint": "tree:..."},
     "data.train": {"path": "...", "fingerprint": "sha256:..."},
     "data.embed_cache": {"path": "...", "model": "...", "max_sequence_length": 32},
     "rewards.ocr.ckpt_dir": {"path": "...", "fingerprint": "tree:..."}}

A hub id or `random:` model is recorded as `ref` (the id and revision): its content is
the hub's at that revision. The embedding cache is recorded by what it encodes (model
identity: the text encoders' weights by sha256; sequence length), not by its shards: it
is appendable (`marble data embed` adds prompts of other tables), and each shard is verified against its recorded sha256
when read (marble.data.embed_cache).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

from marble.assets.manifest import ckpt_dir
from marble.config import RunConfig
from marble.rewards import reward_class
from marble.runtime.fingerprint import HashCache, fingerprint, project_relative
from marble.runtime.io import read_json_object, write_json
from marble.training.run_dir import FRESH_HINT, TrainError

INPUTS_FILE = "inputs.json"


def _path_entry(value: str, cache: HashCache) -> dict:
    return {"path": project_relative(value), "fingerprint": fingerprint(value, cache)}


def model_entry(path: str, revision: str | None, cache: HashCache) -> dict:
    if path.startswith("random:") or not Path(path).expanduser().exists():
        return {"ref": f"{path}@{revision}" if revision else path}
    return _path_entry(path, cache)


def reward_weight_paths(cfg: RunConfig) -> dict[str, str]:
    """`rewards.<name>.<option>` -> path, for every reward option naming an existing file or
    folder, and the reward-checkpoint folder of each reward that reads one (`ckpt_dir`)."""
    out = {}
    for spec in cfg.rewards:
        for key, value in sorted((spec.options or {}).items()):
            if isinstance(value, str) and value and Path(value).expanduser().exists():
                out[f"rewards.{spec.name}.{key}"] = value
        takes = "ckpt_dir" in inspect.signature(reward_class(spec.name).__init__).parameters
        folder = ckpt_dir((spec.options or {}).get("ckpt_dir"))
        if takes and folder.is_dir():
            out[f"rewards.{spec.name}.ckpt_dir"] = str(folder)
    return out


def current_inputs(cfg: RunConfig, cache: HashCache | None = None) -> dict[str, dict]:
    """What this config's inputs hold now (hashes served by the cache while files are unchanged)."""
    cache = cache if cache is not None else HashCache()
    entries = {"model.path": model_entry(cfg.model.path, cfg.model.revision, cache),
               "data.train": _path_entry(cfg.data.train, cache)}
    if cfg.data.embed_cache:
        entries["data.embed_cache"] = embed_cache_entry(cfg.data.embed_cache)
    for key, value in reward_weight_paths(cfg).items():
        entries[key] = _path_entry(value, cache)
    return entries


def embed_cache_entry(folder: str) -> dict:
    index = Path(folder) / "index.json"
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TrainError(f"embedding cache `data.embed_cache` = {folder!r}: {index} unreadable ({exc})") from None
    return {"path": project_relative(folder), "model": data.get("model"),
            "max_sequence_length": data.get("max_sequence_length")}


def _content(entry: dict) -> dict:
    """An entry without its path: what is compared."""
    return {k: v for k, v in entry.items() if k != "path"}


def recorded_inputs(out_dir: Path) -> dict[str, dict] | None:
    try:
        return read_json_object(Path(out_dir) / INPUTS_FILE, "a mapping of input -> fingerprint")
    except ValueError as exc:
        raise TrainError(f"{exc}; restore it, use another --output-dir, or {FRESH_HINT}") from None


def input_differences(saved: dict[str, dict], now: dict[str, dict]) -> list[str]:
    """One phrase per input whose content differs (a key only one side has counts as a change,
    except the embedding cache, which is result-neutral to switch on or off)."""
    out = []
    for key in sorted(set(saved) | set(now)):
        old, new = saved.get(key), now.get(key)
        if key == "data.embed_cache" and (old is None or new is None or _legacy_cache(old)):
            continue
        if old is None or new is None or _content(old) != _content(new):
            out.append(f"{key} ({(new or old).get('path') or (new or old).get('ref')}): "
                       f"{_describe(old)} when the run started, {_describe(new)} now")
    return out


def _legacy_cache(entry: dict) -> bool:
    """A cache recorded by its encoders' file names and sizes (marble before content identities):
    not comparable with today's; the cache in use now was checked against the base's encoders
    (preflight.check_embed_cache, by content, also for a cache switched on at resume) and the
    base against inputs.json, so the run resumes and its inputs.json is rewritten."""
    return str(entry.get("model") or "").startswith("local:")


def _describe(entry: dict | None) -> str:
    if entry is None:
        return "absent"
    return ", ".join(f"{k} {v}" for k, v in _content(entry).items())


def check_inputs(out_dir: Path, now: dict[str, dict]) -> None:
    """Refuse to resume a run whose inputs hold other content than when it started."""
    saved = recorded_inputs(out_dir)
    if saved is None:
        return
    diffs = input_differences(saved, now)
    if diffs:
        raise TrainError(
            f"{Path(out_dir) / INPUTS_FILE}: inputs changed since the run started: {'; '.join(diffs)}. "
            f"Restore them, train into another --output-dir, or {FRESH_HINT}")


def write_inputs(out_dir: Path, now: dict[str, dict]) -> None:
    write_json(Path(out_dir) / INPUTS_FILE, now)
