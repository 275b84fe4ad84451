"""Benchmark prompts, per-sample seeds and rank sharding for `marble evaluate`.

Raw layout (docs/algorithm.md §10): `DIR/geneval/test_metadata.jsonl` (one GenEval record
per line, the prompt under "prompt") and `DIR/{ocr,pickscore,drawbench}/test.txt` (one
prompt a line).
A sample's id is its position in the file, so ids stay stable across runs. The files are
read by dataset assembly's readers (marble.data.assemble), as strictly: an empty line, bad
UTF-8 or a GenEval record without `prompt`, `include` or a known `tag` is an error naming
the file and line (such a record would silently drop out of the GenEval score).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from marble.data.assemble import read_geneval, read_text_prompts
from marble.data.records import prompt_id as make_prompt_id
from marble.evaluation.datasets import (  # noqa: F401  (re-exported)
    DATASETS,
    DEFAULT_BATCH_SIZE,
    DEFAULT_REWARDS,
    GENEVAL,
    PROMPT_FILES,
)
from marble.runtime.io import file_problem
from marble.runtime.seeds import stable_seed



@dataclass(frozen=True)
class EvalSample:
    sample_id: int
    prompt_id: str
    prompt: str
    metadata: dict = field(default_factory=dict)
    repeat: int = 0  # how many earlier samples share this prompt_id (DrawBench lists each prompt 5x)


def dataset_file(data_dir: str | Path, dataset: str) -> Path:
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r} (choose from {', '.join(DATASETS)})")
    return Path(data_dir) / dataset / PROMPT_FILES[dataset]


def _require(path: Path) -> Path:
    problem = file_problem(path)  # a link loop or a folder is said as such, not "not found"
    if problem:
        raise FileNotFoundError(
            f"evaluation prompts {path}: {problem} (expected the raw layout "
            "DIR/geneval/test_metadata.jsonl, DIR/<ocr|pickscore|drawbench>/test.txt; set --data_dir)"
        )
    return path


def _geneval_records(path: Path) -> list[tuple[dict, str]]:
    """(metadata, prompt) per record; an input file, so even a torn last line is an error."""
    return [(meta, meta["prompt"]) for meta in read_geneval(_require(path), str(path))]


def _text_records(path: Path) -> list[tuple[dict, str]]:
    return [({}, prompt) for prompt in read_text_prompts(_require(path), str(path))]


def load_samples(data_dir: str | Path, dataset: str) -> list[EvalSample]:
    """All samples of one benchmark in file order, with ids, metadata and repeat counts."""
    path = dataset_file(data_dir, dataset)
    out: list[EvalSample] = []
    seen: dict[str, int] = {}
    records = _geneval_records(path) if dataset == GENEVAL else _text_records(path)
    for meta, prompt in records:
        meta = {**meta, "source": dataset}
        pid = make_prompt_id(dataset, prompt, meta)
        out.append(EvalSample(len(out), pid, prompt, meta, seen.get(pid, 0)))
        seen[pid] = seen.get(pid, 0) + 1
    return out


def sample_seed(global_seed: int, prompt_id: str, repeat: int = 0) -> int:
    """A 63-bit seed from (global seed, prompt id, repeat index): independent of sharding.
    marble's one seed scheme (`marble.runtime.seeds.stable_seed`)."""
    return stable_seed(int(global_seed), str(prompt_id), int(repeat))


def shard(items: list, rank: int, world_size: int) -> list:
    """Rank `rank`'s strided share: every item lands on exactly one rank."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world of size {world_size}")
    return items[rank::world_size]


def batches(items: list, batch_size: int) -> list[list]:
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    return [items[i : i + batch_size] for i in range(0, len(items), batch_size)]
