"""Assemble the mixed prompt tables with one applicability mask per reward (docs/algorithm.md
§2, §3).

Reads the raw layout (`pickscore/{split}.txt`, `ocr/{split}.txt`,
`geneval/{split}_metadata.jsonl`, `drawbench/test.txt`), validates every line, and writes
`{split}.parquet` plus `{split}_summary.csv`. A text source may hold a prompt table instead of
its `.txt` (`{split}.jsonl` or `{split}.csv`, marble.data.prompt_table): a `prompt` column and
optional per-reward columns saying where each reward applies. Everything is read and checked before
anything is written, so a malformed input leaves no output at all.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import pandas as pd

from marble.data.prompt_table import TABLE_SUFFIXES, read_prompt_table
from marble.data.records import DataError, PromptRecord, compute_masks, mask_column, to_frame
from marble.rewards.geneval_rules import TAGS as GENEVAL_TAGS  # the one definition of the six tags
from marble.runtime.io import atomic_path
from marble.runtime.schema import check_prompt_text, prompt_text_problem

log = logging.getLogger(__name__)

SOURCES = ("pickscore", "ocr", "geneval", "drawbench")
SPLITS = ("train", "test")


def source_file(source: str, split: str) -> str:
    """The raw file of a source and split, relative to the raw dir."""
    return f"geneval/{split}_metadata.jsonl" if source == "geneval" else f"{source}/{split}.txt"


def sources_for_split(split: str) -> list[str]:
    # drawbench's train.txt upstream is a one-line placeholder: test only.
    return [s for s in SOURCES if split == "test" or s != "drawbench"]


def _decode_lines(path: Path, name: str) -> list[str]:
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DataError(f"{name}:{line}: invalid UTF-8 (byte {data[exc.start]:#04x})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":  # a trailing newline is optional (ocr/test.txt has none)
        lines.pop()
    return lines


def read_text_prompts(path: Path, name: str) -> list[str]:
    prompts = []
    for lineno, line in enumerate(_decode_lines(path, name), start=1):
        prompt = line.strip()
        if not prompt:
            raise DataError(f"{name}:{lineno}: empty prompt")
        problem = prompt_text_problem(prompt)  # a BOM, a NUL, an escape sequence: not what was meant
        if problem:
            raise DataError(f"{name}:{lineno}: {problem}")
        prompts.append(prompt)
    return prompts


def check_geneval_record(obj: object, where: str) -> dict:
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    prompt = obj.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise DataError(f"{where}: missing or empty `prompt`")
    check_prompt_text(prompt, where, "prompt", DataError)
    include = obj.get("include")
    if not isinstance(include, list) or not include:
        raise DataError(f"{where}: missing or empty `include` list")
    for i, clause in enumerate(include):
        if not isinstance(clause, dict) or not isinstance(clause.get("class"), str):
            raise DataError(f"{where}: include[{i}] needs a `class` string, got {clause!r}")
    tag = obj.get("tag")
    if tag not in GENEVAL_TAGS:
        raise DataError(f"{where}: unknown GenEval tag {tag!r} (valid: {', '.join(sorted(GENEVAL_TAGS))})")
    return obj


def read_geneval(path: Path, name: str) -> list[dict]:
    out = []
    for lineno, line in enumerate(_decode_lines(path, name), start=1):
        where = f"{name}:{lineno}"
        if not line.strip():
            raise DataError(f"{where}: empty line")
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: bad JSON: {exc.msg} (column {exc.colno})") from None
        out.append(check_geneval_record(obj, where))
    return out


def prompt_path(raw_dir: Path, source: str, split: str) -> Path:
    """The file of a source and split: the raw layout's, else a text source's prompt table."""
    path = raw_dir / source_file(source, split)
    if path.is_file() or source == "geneval":
        return path
    return next((t for t in (path.with_suffix(s) for s in TABLE_SUFFIXES) if t.is_file()), path)


def read_source(raw_dir: Path, source: str, split: str) -> list[PromptRecord]:
    path = prompt_path(raw_dir, source, split)
    name = str(path.relative_to(raw_dir))
    if source == "geneval":
        return [PromptRecord.make(r["prompt"].strip(), source, r) for r in read_geneval(path, name)]
    if path.suffix in TABLE_SUFFIXES:
        return [PromptRecord.make(p, source, meta) for p, meta in read_prompt_table(path, name)]
    return [PromptRecord.make(p, source) for p in read_text_prompts(path, name)]


def read_split(
    raw_dir: str | Path, split: str, sources: Sequence[str] | None = None
) -> list[PromptRecord]:
    """Records of one split. Explicit `sources` are required; by default a missing one is skipped."""
    raw_dir = Path(raw_dir)
    required = sources is not None
    rows: list[PromptRecord] = []
    for source in sources if required else sources_for_split(split):
        if source not in SOURCES:
            raise DataError(f"unknown source {source!r} (known: {', '.join(SOURCES)})")
        path = prompt_path(raw_dir, source, split)
        if not path.is_file():
            if required:
                raise DataError(f"{path}: configured source {source!r} is missing for split {split!r}")
            log.warning("%s: absent, source %r skipped for split %r", path, source, split)
            continue
        rows.extend(read_source(raw_dir, source, split))
    if not rows:
        raise DataError(f"{raw_dir}: no prompt files found for split {split!r}")
    return rows


def summarize(df: pd.DataFrame, reward_names: Iterable[str]) -> pd.DataFrame:
    """Prompts per source, and applicable prompts per reward (per source and in total)."""
    cols = [mask_column(n) for n in reward_names]
    per_source = df.groupby("source", sort=True)[cols].sum().astype(int)
    per_source.insert(0, "prompts", df.groupby("source", sort=True).size().astype(int))
    per_source.loc["total"] = per_source.sum()
    per_source.columns = ["prompts"] + list(reward_names)
    per_source.index.name = "source"
    return per_source.reset_index()


@dataclass
class Assembled:
    split: str
    table: pd.DataFrame
    summary: pd.DataFrame


def assemble_split(
    raw_dir: str | Path,
    split: str,
    rewards: Mapping[str, object],
    sources: Sequence[str] | None = None,
) -> Assembled:
    rows = read_split(raw_dir, split, sources)
    df = to_frame(rows, compute_masks(rows, rewards))
    return Assembled(split, df, summarize(df, list(rewards)))


def write_assembled(out_dir: str | Path, parts: Sequence[Assembled]) -> list[Path]:
    """Write every table and summary atomically (only after all splits assembled)."""
    out_dir = Path(out_dir)
    written = []
    for part in parts:
        table, summary = out_dir / f"{part.split}.parquet", out_dir / f"{part.split}_summary.csv"
        with atomic_path(table) as tmp:
            part.table.to_parquet(tmp, index=False)
        with atomic_path(summary) as tmp:
            part.summary.to_csv(tmp, index=False)
        written += [table, summary]
    return written
