"""A user's prompt table: `RAW/<source>/{split}.jsonl` or `.csv` in place of `{split}.txt`.

One row per prompt: a `prompt` column, and optionally one column per reward (named as the
reward is registered, e.g. `ocr` or a config's own `sharpness`) saying whether that reward
applies to the row: true/false (CSV: true, false, 1, 0, yes, no), or empty/null for the
reward's own rule. What a row states becomes its `applies` metadata, which the mask reads
before the rule (marble.data.records.compute_masks), so it holds in training and evaluation.
Every row is checked before anything is written: an error names file, line and column.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from marble.data.records import APPLIES_KEY, DataError
from marble.rewards import available
from marble.runtime.schema import check_prompt_text

TABLE_SUFFIXES = (".jsonl", ".csv")
_TRUE, _FALSE = {"true", "1", "yes"}, {"false", "0", "no"}


def _flag(value, where: str, column: str) -> bool | None:
    """A cell of a reward column: True, False or None (the reward's rule)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        if not text:
            return None
        if text in _TRUE | _FALSE:
            return text in _TRUE
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise DataError(f"{where}: column {column!r} says where reward {column!r} applies: true, false or empty, "
                    f"got {value!r}")


def _rows(path: Path, name: str) -> list[tuple[str, dict]]:
    """(where, row) per data line: JSON objects of a .jsonl, the records of a .csv (header first)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".csv":
        reader = csv.DictReader(io.StringIO(text))
        if not reader.fieldnames or "prompt" not in reader.fieldnames:
            raise DataError(f"{name}:1: the header needs a `prompt` column, got {reader.fieldnames}")
        return [(f"{name}:{reader.line_num}", dict(row)) for row in reader]
    out = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():  # a blank line (an editor's last newline) holds no prompt
            continue
        where = f"{name}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: bad JSON: {exc.msg} (column {exc.colno})") from None
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
        out.append((where, row))
    return out


def read_prompt_table(path: Path, name: str) -> list[tuple[str, dict]]:
    """(prompt, metadata) per row; a column that is neither `prompt` nor a registered reward is
    an error (a typo would otherwise leave a reward on its rule without a word)."""
    known = set(available())
    out = []
    for where, row in _rows(path, name):
        prompt = row.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise DataError(f"{where}: missing or empty `prompt`")
        check_prompt_text(prompt, where, "prompt", DataError)
        stated = {}
        for column, value in row.items():
            if column == "prompt":
                continue
            if column not in known:
                raise DataError(f"{where}: column {column!r} is not a reward (known: {', '.join(sorted(known))})")
            flag = _flag(value, where, column)
            if flag is not None:
                stated[column] = flag
        out.append((prompt.strip(), {APPLIES_KEY: stated} if stated else {}))
    if not out:
        raise DataError(f"{name}: no prompts")
    return out
