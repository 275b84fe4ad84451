"""Typed reads: what a value read from a file must be before it is used (issue 38 item 4).

Every reader of a boundary file (a prompt file, a training table, an evaluation results
row, a metrics line) checks its values with these pure functions. A value that is not
what its column means (a string "False" in a reward mask, which pandas reads as true; a
score "0.7" in quotes, which the report coerced; a prompt carrying a byte-order mark or a
NUL the text encoder reads but no one sees) is an error naming the place: `where` is the
caller's `file:line` (or `file: row N`), `key` the column or key. `error` is the caller's
exception type (DataError, ResultsError, ReportInputError), so each reader keeps its own.
"""

from __future__ import annotations

import json
import re
from typing import Any

# Characters that change a prompt without showing in it: the byte-order mark (a UTF-8 file
# saved by Windows tools starts with one, and it sticks to the first prompt), the Unicode
# line and paragraph separators (a line break str.splitlines sees and the file's reader
# does not), and every C0/C1 control character but the tab (NUL, escape sequences, ...).
# U+FEFF is refused where a BOM lands, at a prompt's start; inside a prompt it is a zero-width
# no-break space that the upstream data holds (4 lines of pickscore/train.txt) and the
# reference trains on as written, so the paper presets keep it.
_INVISIBLE = {"\ufeff": "a byte-order mark (U+FEFF)", "\u2028": "a line separator (U+2028)",
              "\u2029": "a paragraph separator (U+2029)"}


class SchemaError(ValueError):
    """A value read from a file that is not what its column means (callers pass their own type)."""


_HIDDEN_RE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\ufeff\u2028\u2029]")  # the Cc category but tab, and the above


def prompt_text_problem(text: str) -> str | None:
    """Why `text` is no prompt (None when it is one): empty, or holding an invisible character."""
    if not text.strip():
        return "empty prompt"
    found = _HIDDEN_RE.search(text)
    while found is not None and found.group() == "\ufeff" and found.start() > 0:
        found = _HIDDEN_RE.search(text, found.end())  # a zero-width no-break space inside: kept
    if found is None:
        return None
    char, at = found.group(), found.start() + 1
    what = _INVISIBLE.get(char, f"control character {char!r} (U+{ord(char):04X})")
    return f"{what} at character {at}: it changes the prompt; remove it"


def check_prompt_text(text: Any, where: str, key: str = "prompt", error: type[Exception] = SchemaError) -> str:
    """`text` when it is a usable prompt; else `error` naming where and the key."""
    if not isinstance(text, str):
        raise error(f"{where}: `{key}` must be text, got {type(text).__name__} {text!r}")
    problem = prompt_text_problem(text)
    if problem:
        raise error(f"{where}: `{key}`: {problem}")
    return text


def is_number(value: Any) -> bool:
    """An int or float that is not a bool (JSON true is no number)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_int(value: Any, where: str, key: str, error: type[Exception] = SchemaError, minimum: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise error(f"{where}: `{key}` must be an integer >= {minimum}, got {value!r}")
    return value


def check_str(value: Any, where: str, key: str, error: type[Exception] = SchemaError, empty: bool = False) -> str:
    if not isinstance(value, str) or (not empty and not value):
        raise error(f"{where}: `{key}` must be {'a' if empty else 'a non-empty'} string, got {value!r}")
    return value


def check_str_list(value: Any, where: str, key: str, error: type[Exception] = SchemaError) -> list[str]:
    """A list of strings (a JSON string in its place would be searched by substring)."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise error(f"{where}: `{key}` must be a list of names, got {value!r}")
    return value


def check_mask_value(value: Any, where: str, key: str, error: type[Exception] = SchemaError) -> bool:
    """A reward-mask cell: a real boolean (pandas reads the string "False", and NaN, as true)."""
    if not isinstance(value, bool):
        try:
            import numpy as np
            if isinstance(value, np.bool_):
                return bool(value)
        except ImportError:  # pragma: no cover - numpy comes with pandas
            pass
        raise error(f"{where}: `{key}` must be true or false, got {type(value).__name__} {value!r}")
    return value


def check_json_object(value: Any, where: str, key: str, error: type[Exception] = SchemaError) -> dict:
    """A cell holding a JSON object as text (the tables' `metadata`); returns the object."""
    if not isinstance(value, str):
        raise error(f"{where}: `{key}` must be a JSON object as text, got {type(value).__name__}")
    try:
        obj = json.loads(value)
    except json.JSONDecodeError as exc:
        raise error(f"{where}: `{key}` is not JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise error(f"{where}: `{key}` must be a JSON object, got {type(obj).__name__}")
    return obj


# metrics.jsonl keys that hold text or records, not numbers (marble.training.metrics,
# marble/balancers/levels.py); every other value of a metrics line is a number, null or a bool.
METRICS_TEXT_KEYS = frozenset({"balancer", "stage_name", "eval_id"})
METRICS_RECORD_KEYS = frozenset({"diag_micro"})


def check_metrics_line(record: Any, where: str, error: type[Exception] = SchemaError) -> dict:
    """One line of metrics.jsonl or eval.jsonl: an object with an integer `step`, text under the
    text keys, and a number (or null, or a bool flag) under every other key."""
    if not isinstance(record, dict):
        raise error(f"{where}: expected a JSON object, got {type(record).__name__}")
    if "step" not in record:
        raise error(f"{where}: expected an object with a `step` key")
    check_int(record["step"], where, "step", error)
    for key, value in record.items():
        if key == "step" or value is None or key in METRICS_RECORD_KEYS:
            continue
        if key in METRICS_TEXT_KEYS:
            if not isinstance(value, str):
                raise error(f"{where}: `{key}` must be text, got {value!r}")
        elif not (isinstance(value, bool) or is_number(value)):
            raise error(f"{where}: `{key}` = {value!r} is not a number (a metric is a number or null)")
    return record


_SHA256_RE = re.compile("[0-9a-f]{64}")


def check_result_row(row: dict, where: str, error: type[Exception] = SchemaError) -> dict:
    """A row of evaluation_results.jsonl beyond its sample_id and scores (marble.evaluation.results
    checks those): a `not_applicable` or `failed` that is a string was searched by substring
    (`"ocr" in "pickscore,ocr"`), a `metadata` that is no mapping lost GenEval's tag, a `rev`,
    prompt or image path that is not what it means matched the wrong sample; `image_sha256` (the
    saved image's digest, marble.evaluation.runner) decides whether a resume reuses the file. An
    absent key is a row of an earlier release, read as before."""
    if "rev" in row:
        check_int(row["rev"], where, "rev", error, minimum=1)
    for key in ("prompt_id", "prompt"):
        if key in row:
            check_str(row[key], where, key, error)
    for key in ("not_applicable", "failed"):
        if row.get(key) is not None:
            check_str_list(row[key], where, key, error)
    if row.get("metadata") is not None and not isinstance(row["metadata"], dict):
        raise error(f"{where}: `metadata` must be a mapping, got {row['metadata']!r}")
    if row.get("scores") is not None and not isinstance(row["scores"], dict):
        raise error(f"{where}: `scores` must be a mapping, got {row['scores']!r}")
    if row.get("image_path") is not None:
        check_str(row["image_path"], where, "image_path", error)
    if row.get("image_sha256") is not None and not (isinstance(row["image_sha256"], str)
                                                    and _SHA256_RE.fullmatch(row["image_sha256"])):
        raise error(f"{where}: `image_sha256` must be 64 hex digits (the saved image's sha256), "
                    f"got {row['image_sha256']!r}")
    return row
