"""Validate, then write: every input of `marble train` checked before the first file is written.

A start that failed on a bad input used to leave config.yaml behind, and the corrected
command was refused as "a different training config". `preflight(cfg, out_dir)` reads
every input the way training will (reward names against the registry, the table parsed
and non-empty, the model folder a diffusers folder, the embedding cache built for this
model and sequence length), then checks the run folder's identity (config.yaml keys,
inputs.json content), and returns the inputs' fingerprints for `run_training` to record
once the trainer is built. Nothing here writes. Errors are TrainError, one line naming
the key, the file and the value.
"""

from __future__ import annotations

import json
from pathlib import Path

from marble.config import RunConfig, stage_config
from marble.rewards import available
from marble.runtime.fingerprint import mismatched
from marble.training.inputs import check_inputs, current_inputs
from marble.training.run_dir import TrainError, check_checkpoint_identities, check_run_dir, run_identity


def check_rewards(cfg: RunConfig) -> None:
    known = available()
    # The run's rewards, then each stage's (a curriculum stage may name its own set).
    stages = [(f"stages[{k}].", stage_config(cfg, k)) for k in range(len(cfg.stages))]
    for where, config in [("", cfg), *stages]:
        for i, name in enumerate(config.reward_names):
            if name not in known:
                raise TrainError(f"`{where}rewards[{i}].name` = {name!r} is not a reward "
                                 f"(available: {', '.join(known)})")


def check_table(cfg: RunConfig) -> None:
    """data.train, and data.test when the held-out evaluation reads it (train.eval_every > 0)."""
    table = _check_one_table("data.train", cfg.data.train, "assemble it with `marble data assemble`")
    check_reward_coverage(cfg, table)
    if cfg.train.eval_every > 0:
        _check_one_table("data.test", cfg.data.test,
                         f"train.eval_every = {cfg.train.eval_every} evaluates on it; assemble it, "
                         "or set train.eval_every=0 to train without a held-out evaluation")


def _check_one_table(key: str, path: str, hint: str) -> None:
    from marble.data.records import DataError, load_table

    try:
        table = load_table(path)
    except FileNotFoundError:
        raise TrainError(f"table not found: `{key}` = {path!r} ({hint})") from None
    except DataError as exc:
        raise TrainError(f"`{key}`: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - pyarrow raises its own types for a damaged file
        raise TrainError(f"`{key}` = {path!r} is not a readable parquet table "
                         f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None
    if len(table) == 0:
        raise TrainError(f"`{key}` = {path!r} holds no prompts (an empty table)")
    return table


def check_reward_coverage(cfg: RunConfig, table) -> None:
    """A reward of the run (or of a stage) whose `applies__<reward>` column is false on every row
    of the training table would train on nothing but NaN-masked rows for it: an error at start,
    not a run whose metrics say `reward/<name>` NaN hours later. (A reward without a column is
    scored everywhere: nothing to check.)"""
    from marble.data.records import reward_masks

    names = dict.fromkeys(n for k in range(len(cfg.stages)) for n in stage_config(cfg, k).reward_names)
    names = list(dict.fromkeys([*cfg.reward_names, *names]))
    for name, mask in reward_masks(table, names).items():
        if not any(mask):
            raise TrainError(f"reward {name!r} applies to no prompt of `data.train` = {cfg.data.train!r} "
                             f"(its applies__{name} column is false on all {len(mask)} rows); train on a table "
                             "assembled with prompts it scores, or drop the reward")
    for k, stage in enumerate(cfg.stages):
        check_stage_coverage(cfg, table, k, stage.sources)


def check_stage_coverage(cfg: RunConfig, table, index: int, sources: list[str] | None) -> None:
    """A stage draws only its `sources`' rows: a source without rows, or a reward of the stage that
    applies to none of them, failed only when that stage began (hours in, for a later stage)."""
    from marble.data.records import reward_masks

    if sources is None:
        return
    name = cfg.stages[index].name or f"stages[{index}]"
    have = set(table["source"])
    missing = [s for s in sources if s not in have]
    if missing:
        raise TrainError(f"stage {name!r}: `stages[{index}].sources` {missing} have no rows in `data.train` = "
                         f"{cfg.data.train!r} (its sources: {sorted(have)})")
    rows = table[table["source"].isin(sources)]
    for reward, mask in reward_masks(rows, stage_config(cfg, index).reward_names).items():
        if not any(mask):
            raise TrainError(f"reward {reward!r} of stage {name!r} applies to no prompt of its sources {sources} "
                             f"in `data.train` = {cfg.data.train!r} ({len(mask)} rows); give the stage sources "
                             "it scores, or drop the reward from the stage")


def unreadable_weights(folder: Path) -> str | None:
    """The first safetensors file of a model folder whose header does not parse (a truncated
    or overwritten file: diffusers would fail deep in from_pretrained), with the reason."""
    from safetensors import safe_open

    for path in sorted(folder.rglob("*.safetensors")):
        if any(part.startswith(".") for part in path.relative_to(folder).parts):
            continue
        try:
            with safe_open(str(path), framework="np"):
                pass
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own SafetensorError
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return f"{path}: not a readable safetensors file ({why})"
    return None


def check_model_folder(cfg: RunConfig) -> None:
    path = Path(cfg.model.path).expanduser()
    if cfg.model.path.startswith("random:") or not path.exists():
        return  # a hub id (or its refusal) is `marble train`'s check_model_path
    if not path.is_dir() or not (path / "model_index.json").is_file():
        raise TrainError(f"`model.path` = {cfg.model.path!r} is not a diffusers model folder "
                         "(no model_index.json)")
    damaged = unreadable_weights(path)
    if damaged:
        raise TrainError(f"`model.path` = {cfg.model.path!r} does not load: {damaged}")


def check_embed_cache(cfg: RunConfig) -> None:
    """The cache must encode prompts with this model's text encoders at this sequence length."""
    if not cfg.data.embed_cache:
        return
    from marble.data.embed_cache import INDEX, identity_mismatch, model_identity

    index_path = Path(cfg.data.embed_cache) / INDEX
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TrainError(f"`data.embed_cache` = {cfg.data.embed_cache!r}: {index_path} unreadable "
                         f"({type(exc).__name__}); rebuild it with `marble data embed`") from None
    encoders = model_identity(cfg.model.path)
    if index.get("model") != encoders:  # by content: another base's encoders of the same shapes too
        raise TrainError(f"`data.embed_cache` = {cfg.data.embed_cache!r} "
                         f"{identity_mismatch(index.get('model'), cfg.model.path, encoders)} (`model.path`); "
                         "rebuild it with `marble data embed` into an empty --out")
    want = {"max_sequence_length": cfg.model.max_sequence_length}
    for key, value in want.items():
        if index.get(key) != value:
            raise TrainError(f"`data.embed_cache` = {cfg.data.embed_cache!r} was built for {key} "
                             f"{index.get(key)!r}, this run uses {value!r} (`model.path` / "
                             "`model.max_sequence_length`); rebuild it with `marble data embed`")
    damaged = mismatched(cfg.data.embed_cache, index.get("checksums") or {})
    if damaged:
        raise TrainError(f"`data.embed_cache` = {cfg.data.embed_cache!r} is damaged ({'; '.join(damaged)}); "
                         "rebuild it with `marble data embed` into an empty --out")


def check_output_dir(out_dir: Path) -> None:
    """The run folder, or the nearest of its parents that exists, must be a folder: a file there
    failed only once the model loaded (FileExistsError from mkdir, ENOTDIR from the lock)."""
    for path in (Path(out_dir), *Path(out_dir).parents):
        if path.exists() or path.is_symlink():
            if not path.is_dir():
                what = "is a file" if path == Path(out_dir) else f"lies under {path}, a file"
                raise TrainError(f"--output-dir {out_dir} {what}, not a folder; give a run folder's path")
            return


def preflight(cfg: RunConfig, out_dir: Path, resume: bool = True, adopt: bool = False) -> dict[str, dict]:
    """Every check, no write; returns the inputs' fingerprints (marble.training.inputs).
    `resume=False` (`--fresh`: the folder is set aside, not resumed) skips the folder's
    identity; every input is still checked, so a bad one moves nothing. `adopt`
    (`--adopt-checkpoint`): checkpoints without identity files are taken as this run's."""
    check_output_dir(Path(out_dir))
    check_rewards(cfg)
    check_model_folder(cfg)
    check_table(cfg)
    check_embed_cache(cfg)
    if resume:
        check_run_dir(Path(out_dir), cfg, adopt)
    now = current_inputs(cfg)
    if resume:
        check_inputs(Path(out_dir), now)
        check_checkpoint_identities(Path(out_dir), run_identity(cfg, now), adopt)
    return now
