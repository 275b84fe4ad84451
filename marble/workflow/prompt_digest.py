"""A checksum file stands in for each benchmark's prompt file, so Snakemake notices an edit.

The evaluation rule's input was the prompt folder (`raw_dir`, a `directory()` output), which
Snakemake dates by its own timestamp: rewriting a prompt file in place leaves it unchanged, and
`snakemake all` said "Nothing to be done" over scores of the old prompts. A file inside another
rule's `directory()` output cannot be an input (it is missing until that rule runs), so
`<DIGEST_DIR>/<dataset>.sha256`, the sha256 of the prompt file's bytes, is the input instead:

- `sync_digests`, called each time the Snakefile is read (dry runs too), rewrites a digest whose
  prompt file changed, and only then: an edit dates the digest after the evaluation (it reruns),
  an unchanged file keeps its mtime (nothing reruns);
- rule `prompt_digest` (this module's command) writes a missing one: on a fresh checkout the
  prompt files do not exist while the DAG is built.

    python -m marble.workflow.prompt_digest RAW_DIR DATASET --out FILE

Torch-free (the Snakefile imports it).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Iterable
from pathlib import Path

from marble.evaluation.datasets import DATASETS, PROMPT_FILES

DIGEST_DIR = "results/prompts"


def prompt_file(raw_dir: str | Path, dataset: str) -> Path:
    return Path(raw_dir) / dataset / PROMPT_FILES[dataset]


def digest_text(path: str | Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
    return f"sha256:{sha.hexdigest()}\n"


def write_if_changed(out: str | Path, text: str) -> bool:
    """Write `text` atomically unless `out` already holds it (an unchanged digest keeps its mtime)."""
    out = Path(out)
    if out.is_file() and out.read_text(encoding="utf-8") == text:
        return False
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out)
    return True


def sync_digests(raw_dir: str | Path, digest_dir: str | Path, datasets: Iterable[str] = DATASETS) -> list[str]:
    """Bring the digest of every existing prompt file up to date; the datasets rewritten."""
    written = []
    for dataset in datasets:
        source = prompt_file(raw_dir, dataset)
        if source.is_file() and write_if_changed(Path(digest_dir) / f"{dataset}.sha256", digest_text(source)):
            written.append(dataset)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m marble.workflow.prompt_digest",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("raw_dir")
    parser.add_argument("dataset", choices=DATASETS)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    source = prompt_file(args.raw_dir, args.dataset)
    if not source.is_file():
        print(f"prompt_digest: {source} not found (the {args.dataset} prompts under raw_dir)", file=sys.stderr)
        return 2
    write_if_changed(args.out, digest_text(source))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
