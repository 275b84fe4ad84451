"""Prompt-embedding cache: each unique prompt is encoded once by the three text encoders.

Layout of a cache folder:
  index.json                 model identity (the text encoders' weights by sha256, model_identity),
                             max_sequence_length, shapes, key -> [shard, row]
  shard-00000.safetensors    `prompt_embeds` [n, L, D] and `pooled` [n, Dp], one row per key
A key is sha1(model identity NUL max_sequence_length NUL prompt). Shards are written
atomically and the index, which records each shard's sha256 (`checksums`), is rewritten
after each one, so an interrupted run resumes where
it stopped and a second run encodes nothing. Rows are read through safetensors slices
(memory-mapped), so a lookup never loads whole shards. Opening a cache verifies every
shard against its recorded sha256 (marble.runtime.fingerprint: re-hashed only when a
shard's stat key moved), so damaged floats are refused by name, never trained on.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterable, Sequence

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from marble.data.records import load_table
from marble.models import load_pipeline
from marble.models.encode import encode_prompts
from marble.runtime.fingerprint import HashCache, fingerprint, mismatched
from marble.runtime.io import atomic_path, write_json

INDEX = "index.json"
FORMAT_VERSION = 1


def prompt_key(prompt: str, max_sequence_length: int, model_id: str) -> str:
    return hashlib.sha1(f"{model_id}\0{max_sequence_length}\0{prompt}".encode("utf-8")).hexdigest()


# The identity's prefix: by the encoders' content. A cache of an earlier marble ("local:<folder
# name>:<hash of file names and sizes>") identified another base's encoders of the same shapes as
# these, so it is refused (rebuilt), never reused.
CONTENT_PREFIX = "encoders:sha256:"


def model_identity(model: str, cache: HashCache | None = None) -> str:
    """A string that changes when the text encoders' or tokenizers' content changes.

    Local folder: sha256 over each `text_encoder*` / `tokenizer*` subfolder's content
    fingerprint (marble.runtime.fingerprint: every file's sha256, weights included, served
    by the hash cache while the files are unchanged, so a start re-hashes nothing). Not the
    folder's name or path: a moved project keeps its caches. Hub id: the id itself (pin a
    revision upstream).
    """
    path = Path(model).expanduser()
    if not path.is_dir():
        return str(model)
    cache = cache if cache is not None else HashCache()
    digest = hashlib.sha256()
    for sub in sorted(p for p in path.iterdir() if p.is_dir() and p.name.startswith(("text_encoder", "tokenizer"))):
        digest.update(f"{sub.name}\0{fingerprint(sub, cache)}\n".encode())
    return f"{CONTENT_PREFIX}{digest.hexdigest()}"


def identity_mismatch(built_for, model: str, wanted: str) -> str:
    """Why a cache built for `built_for` does not serve `model` (identity `wanted`)."""
    if isinstance(built_for, str) and built_for.startswith("local:"):
        return (f"was built by an earlier marble, whose identity ({built_for!r}) named the text encoders' "
                f"files and sizes, not their weights; it may hold another base's embeddings")
    return f"was built for text encoders {built_for!r}, {model!r} holds {wanted!r}"


def unique_prompts(tables: Iterable[str | Path]) -> list[str]:
    """Unique prompts of assembled tables, in first-seen order."""
    seen: dict[str, None] = {}
    for table in tables:
        for prompt in load_table(table)["prompt"]:
            seen.setdefault(str(prompt), None)
    return list(seen)


class EmbedCacheError(ValueError):
    """An embedding cache that is damaged or was built for other encoders; names the folder."""


def verify_shards(directory: Path, index: dict) -> None:
    """Every shard matches the sha256 the index recorded (caches from before checksums: none)."""
    problems = mismatched(directory, index.get("checksums") or {})
    if problems:
        raise EmbedCacheError(f"embedding cache {directory} is damaged ({'; '.join(problems)}); "
                              "rebuild it with `marble data embed` into an empty --out")


class EmbeddingCache:
    """Read side: `lookup(prompts) -> (prompt_embeds [N, L, D], pooled [N, Dp])`."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        index_path = self.dir / INDEX
        if not index_path.is_file():
            raise FileNotFoundError(f"embedding cache {self.dir}: no {INDEX} (run `marble data embed`)")
        try:
            self.index = json.loads(index_path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise EmbedCacheError(f"embedding cache {index_path}: invalid JSON ({exc})") from None
        verify_shards(self.dir, self.index)
        self.model_id: str = self.index["model"]
        self.max_sequence_length: int = int(self.index["max_sequence_length"])
        self.entries: dict[str, list] = self.index["entries"]
        self._handles: dict[str, object] = {}

    def key(self, prompt: str) -> str:
        return prompt_key(prompt, self.max_sequence_length, self.model_id)

    def __len__(self) -> int:
        return len(self.entries)

    def contains(self, prompt: str) -> bool:
        return self.key(prompt) in self.entries

    def _handle(self, shard: str):
        if shard not in self._handles:
            self._handles[shard] = safe_open(str(self.dir / shard), framework="pt")
        return self._handles[shard]

    def lookup(self, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        embeds, pooled = [], []
        for prompt in prompts:
            entry = self.entries.get(self.key(prompt))
            if entry is None:
                raise KeyError(
                    f"prompt {prompt!r} is not in the embedding cache {self.dir} "
                    f"(max_sequence_length {self.max_sequence_length}); rerun `marble data embed`"
                )
            shard, row = entry
            handle = self._handle(shard)
            embeds.append(handle.get_slice("prompt_embeds")[row : row + 1])
            pooled.append(handle.get_slice("pooled")[row : row + 1])
        if not embeds:
            raise ValueError("lookup of an empty prompt list")
        return torch.cat(embeds), torch.cat(pooled)


def _load_index(out: Path, model_id: str, max_sequence_length: int, dtype: str, model: str = "") -> dict:
    path = out / INDEX
    if not path.is_file():
        return {"format": FORMAT_VERSION, "model": model_id, "max_sequence_length": max_sequence_length,
                "dtype": dtype, "shards": [], "entries": {}}
    index = json.loads(path.read_text(encoding="utf-8"))
    if index.get("model") != model_id and model_id.startswith(CONTENT_PREFIX):
        raise ValueError(f"{path}: the cache {identity_mismatch(index.get('model'), model, model_id)}; "
                         "use another --out folder")
    for key, want in (("model", model_id), ("max_sequence_length", max_sequence_length), ("dtype", dtype)):
        if index.get(key) != want:
            raise ValueError(
                f"{path}: cache built for {key}={index.get(key)!r}, asked for {want!r}; "
                "use another --out folder"
            )
    return index


def build_cache(
    tables: Sequence[str | Path],
    model: str,
    out: str | Path,
    max_sequence_length: int = 128,
    batch_size: int = 16,
    shard_size: int = 1024,
    pipe=None,
    dtype: str = "float32",
    device: str = "cpu",
) -> dict[str, int]:
    """Encode every prompt of `tables` not yet in `out`; returns counts.

    `dtype` is the encoders' and the stored precision: SD3.5-M embeddings are
    205 x 4096 per prompt, 3.4 MB in float32, so a full train set wants float16/bfloat16.
    """
    out = Path(out)
    model_id = model_identity(model)
    index = _load_index(out, model_id, max_sequence_length, dtype, model)
    prompts = unique_prompts(tables)
    todo = [p for p in prompts if prompt_key(p, max_sequence_length, model_id) not in index["entries"]]
    stats = {"unique": len(prompts), "encoded": len(todo), "cached": len(prompts) - len(todo)}
    if not todo:
        return stats  # nothing to do: the pipeline is never loaded
    if pipe is None:
        pipe = load_pipeline(model, dtype=getattr(torch, dtype), device=device)
    bar = tqdm(total=len(todo), desc="embed prompts", unit="prompt")
    for start in range(0, len(todo), shard_size):
        chunk = todo[start : start + shard_size]
        parts = [encode_prompts(pipe, chunk[i : i + batch_size], max_sequence_length)
                 for i in range(0, len(chunk), batch_size)]
        for p in parts:
            bar.update(len(p[0]))
        shard = f"shard-{len(index['shards']):05d}.safetensors"
        store = getattr(torch, dtype)
        tensors = {"prompt_embeds": torch.cat([p[0] for p in parts]).to("cpu", store).contiguous(),
                   "pooled": torch.cat([p[1] for p in parts]).to("cpu", store).contiguous()}
        with atomic_path(out / shard) as tmp:
            save_file(tensors, str(tmp))
        index["shards"].append(shard)
        index.setdefault("checksums", {})[shard] = HashCache().sha256(out / shard)
        for row, prompt in enumerate(chunk):
            index["entries"][prompt_key(prompt, max_sequence_length, model_id)] = [shard, row]
        index["embed_shape"] = list(tensors["prompt_embeds"].shape[1:])
        index["pooled_dim"] = int(tensors["pooled"].shape[1])
        write_json(out / INDEX, index)  # after the shard: a crash leaves a consistent index
    bar.close()
    return stats
