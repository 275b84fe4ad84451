"""Prompt records and the assembled-table format (docs/ARCHITECTURE.md "Conventions").

A table is a parquet file with columns `prompt_id, prompt, source, metadata` (metadata a
JSON string with sorted keys) and one bool column `applies__<reward>` per reward.

The reward mask has its one home here: `compute_masks` applies each reward's rule
(`Reward.applies`) to rows (assembly, and evaluation's samples), `to_frame` writes the result
as `applies__*` columns, `reward_masks` reads them back (training).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd

from marble.runtime.schema import check_json_object, check_mask_value, check_prompt_text, check_str

MASK_PREFIX = "applies__"
APPLIES_KEY = "applies"  # metadata: {reward: bool} a prompt table states per row (marble.data.prompt_table)
BASE_COLUMNS = ["prompt_id", "prompt", "source", "metadata"]


class DataError(ValueError):
    """Bad input data; the message starts with `file:line:` where there is one."""


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def prompt_id(source: str, prompt: str, metadata: dict | None = None) -> str:
    """First 16 hex of sha1(source NUL prompt NUL canonical-json(metadata minus "source"))."""
    meta = {k: v for k, v in (metadata or {}).items() if k != "source"}
    payload = f"{source}\0{prompt}\0{canonical_json(meta)}"
    return hashlib.sha1(payload.encode("utf-8")).hexdigest()[:16]


@dataclass
class PromptRecord:
    prompt_id: str
    prompt: str
    source: str
    metadata: dict = field(default_factory=dict)

    @classmethod
    def make(cls, prompt: str, source: str, metadata: dict | None = None) -> "PromptRecord":
        meta = dict(metadata or {})
        meta["source"] = source  # always set: rewards' applies_to override reads it
        return cls(prompt_id(source, prompt, meta), prompt, source, meta)


def mask_column(reward: str) -> str:
    return f"{MASK_PREFIX}{reward}"


def mask_columns(df: pd.DataFrame) -> list[str]:
    return [c for c in df.columns if c.startswith(MASK_PREFIX)]


def reward_masks(df: pd.DataFrame, names: Iterable[str] | None = None) -> dict[str, list[bool]]:
    """{reward name: per-row applicability} from the `applies__*` columns; with `names`, only
    those rewards, in that order (one without a column is left out: no mask was written)."""
    present = {c[len(MASK_PREFIX):]: c for c in mask_columns(df)}
    wanted = list(present) if names is None else [n for n in names if n in present]
    return {name: df[present[name]].astype(bool).tolist() for name in wanted}


def compute_masks(rows: Sequence[Any], rewards: Mapping[str, Any]) -> dict[str, list[bool]]:
    """{reward name: [reward.applies(prompt, metadata) per row]}; a row is anything with
    `.prompt` and `.metadata` (a PromptRecord, an evaluation sample). A row whose metadata says
    so itself (`applies: {reward: bool}`, a user's prompt table) overrides the reward's rule."""
    def applies(reward_name: str, reward, row) -> bool:
        stated = (row.metadata or {}).get(APPLIES_KEY) or {}
        if reward_name in stated:
            return bool(stated[reward_name])
        return bool(reward.applies(row.prompt, dict(row.metadata)))

    return {name: [applies(name, reward, r) for r in rows] for name, reward in rewards.items()}


def to_frame(rows: Iterable[PromptRecord], masks: dict[str, list[bool]] | None = None) -> pd.DataFrame:
    rows = list(rows)
    df = pd.DataFrame(
        {
            "prompt_id": [r.prompt_id for r in rows],
            "prompt": [r.prompt for r in rows],
            "source": [r.source for r in rows],
            "metadata": [canonical_json(r.metadata) for r in rows],
        },
        columns=BASE_COLUMNS,
    )
    for name, values in (masks or {}).items():
        if len(values) != len(rows):
            raise ValueError(f"mask {name!r} has {len(values)} values for {len(rows)} rows")
        df[mask_column(name)] = pd.Series(values, dtype=bool)
    return df


def load_table(path: str | Path) -> pd.DataFrame:
    """Read an assembled table; a missing file or column is an error naming the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"dataset table {path} does not exist (build it with `marble data assemble`)"
        )
    df = pd.read_parquet(path)
    missing = [c for c in BASE_COLUMNS if c not in df.columns]
    if missing:
        raise DataError(f"{path}: missing columns {missing} (have {list(df.columns)})")
    check_table_values(df, str(path))
    return df


def check_table_values(df: pd.DataFrame, name: str) -> None:
    """Every cell is what its column means (DataError naming file, row and column): ids and
    sources non-empty text, prompts text without invisible characters, metadata a JSON
    object, masks true/false. A mask column of strings or with a null was read as true on
    every row ("False" is a non-empty string), so a reward trained on prompts it excludes."""
    for col in mask_columns(df):
        if df[col].dtype != bool:  # a bool column holds nothing else; find the first cell that is not
            for row, value in zip(df.index, df[col]):
                check_mask_value(value, f"{name}: row {row}", col, DataError)
    for row, pid, prompt, source, meta in zip(df.index, df["prompt_id"], df["prompt"], df["source"],
                                              df["metadata"]):
        where = f"{name}: row {row}"
        check_str(pid, where, "prompt_id", DataError)
        check_prompt_text(prompt, where, "prompt", DataError)
        check_str(source, where, "source", DataError)
        check_json_object(meta, where, "metadata", DataError)


def records(df: pd.DataFrame) -> list[PromptRecord]:
    """The rows of a table as PromptRecords (metadata parsed back into dicts)."""
    out = []
    for pid, prompt, source, meta in zip(df["prompt_id"], df["prompt"], df["source"], df["metadata"]):
        out.append(PromptRecord(str(pid), str(prompt), str(source), json.loads(meta)))
    return out
