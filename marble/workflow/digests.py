"""Digest files stand in for input files and folders, so Snakemake sees a change of content.

Snakemake decides what is stale by dates. A folder's date moves when an entry is added or
removed, not when a file inside is rewritten: a base model, a reward checkpoint folder, a LoRA
folder or an embedding cache overwritten in place left every rule that reads it "up to date",
and `snakemake all` kept the old scores. A file inside another rule's `directory()` output
cannot be an input either (it is missing until that rule runs). So each such input has a
digest file beside the rules that read it, and the rules take the digest as an input too:

- prompt files: `<PROMPT_DIGEST_DIR>/<dataset>.sha256`, the sha256 of the prompt file;
- folders: `<FOLDER_DIGEST_DIR>/<name>-<hash of the path>.tree`, the folder's tree fingerprint
  (marble.runtime.fingerprint: the same identity `marble train` and `marble evaluate` check,
  file digests served by the one hash cache, so a 16 GB base model is hashed once, not at every
  read of the Snakefile).

Two writers keep them current:

- `sync_prompt_digests` / `sync_folder_digests`, called each time the Snakefile is read (dry
  runs too; by the main process only), rewrite a digest whose source changed, and only then: a
  change dates the digest after the outputs that read it (they rerun), an unchanged source
  keeps the digest's mtime (nothing reruns);
- rules `prompt_digest` and `folder_digest` (this module's command) write a missing one: on a
  fresh checkout the sources do not exist while the DAG is built, or another rule makes them.

    python -m marble.workflow.digests prompt RAW_DIR DATASET --out FILE
    python -m marble.workflow.digests folder FOLDER --out FILE

Torch-free (the Snakefile imports it).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path

from marble.evaluation.datasets import DATASETS, PROMPT_FILES
from marble.runtime.fingerprint import HashCache, fingerprint, project_relative
from marble.runtime.io import write_text

PROMPT_DIGEST_DIR = "results/prompts"
FOLDER_DIGEST_DIR = "results/digests"


def prompt_file(raw_dir: str | Path, dataset: str) -> Path:
    return Path(raw_dir) / dataset / PROMPT_FILES[dataset]


def digest_text(path: str | Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
    return f"sha256:{sha.hexdigest()}\n"


def folder_digest_text(folder: str | Path, cache: HashCache | None = None) -> str:
    return f"{fingerprint(folder, cache)}\n"


def write_if_changed(out: str | Path, text: str) -> bool:
    """Write `text` atomically unless `out` already holds it (an unchanged digest keeps its mtime)."""
    out = Path(out)
    if out.is_file() and out.read_text(encoding="utf-8") == text:
        return False
    write_text(out, text)
    return True


def sync_prompt_digests(raw_dir: str | Path, digest_dir: str | Path = PROMPT_DIGEST_DIR,
                        datasets: Iterable[str] = DATASETS) -> list[str]:
    """Bring the digest of every existing prompt file up to date; the datasets rewritten."""
    written = []
    for dataset in datasets:
        source = prompt_file(raw_dir, dataset)
        if source.is_file() and write_if_changed(Path(digest_dir) / f"{dataset}.sha256", digest_text(source)):
            written.append(dataset)
    return written


def folder_digest_name(folder: str | Path) -> str:
    """`<last part>-<12 hex of the project-relative path>`: readable, and one file per folder
    (two folders named `lora` in different places never share a digest)."""
    where = project_relative(folder)
    tail = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(where).name or "root").lstrip(".") or "root"
    return f"{tail}-{hashlib.sha256(where.encode()).hexdigest()[:12]}"


def folder_digest_path(folder: str | Path, digest_dir: str | Path = FOLDER_DIGEST_DIR) -> str:
    return f"{digest_dir}/{folder_digest_name(folder)}.tree"


def sync_folder_digests(folders: Iterable[str | Path], digest_dir: str | Path = FOLDER_DIGEST_DIR,
                        cache: HashCache | None = None) -> list[str]:
    """Bring the digest of every existing folder up to date; the folders rewritten. A folder
    that vanishes or cannot be read meanwhile is left to its rule (it reports the cause)."""
    cache = cache if cache is not None else HashCache(autosave=False)
    written = []
    for folder in dict.fromkeys(str(f) for f in folders):
        if not Path(folder).is_dir():
            continue
        try:
            text = folder_digest_text(folder, cache)
        except OSError:
            continue
        out = Path(folder_digest_path(folder, digest_dir))
        first = not out.exists()
        if write_if_changed(out, text):
            written.append(folder)
        if first:
            # First sight of this folder (a new project, or one made before digests existed):
            # dated as the folder, the date every plan went by until now, so introducing the
            # digest replans nothing; from now on a change of content redates it.
            stat = Path(folder).stat()
            os.utime(out, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    cache.save()  # once for every file hashed (autosave off): not one rewrite per new file
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m marble.workflow.digests",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="kind", required=True)
    prompt = sub.add_parser("prompt", help="the sha256 of one benchmark's prompt file")
    prompt.add_argument("raw_dir")
    prompt.add_argument("dataset", choices=DATASETS)
    prompt.add_argument("--out", required=True)
    folder = sub.add_parser("folder", help="the tree fingerprint of a folder")
    folder.add_argument("folder")
    folder.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    source = prompt_file(args.raw_dir, args.dataset) if args.kind == "prompt" else Path(args.folder)
    if not (source.is_file() if args.kind == "prompt" else source.is_dir()):
        print(f"digests: {source} not found", file=sys.stderr)
        return 2
    cache = HashCache(autosave=False)
    text = digest_text(source) if args.kind == "prompt" else folder_digest_text(source, cache)
    write_if_changed(args.out, text)
    cache.save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
