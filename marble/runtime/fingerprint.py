"""Content fingerprints of input files and folders, and the one hash cache that serves them.

A run, an evaluation, an embedding cache and a download are identified by what their
inputs hold, not by where the inputs lie: `fingerprint(path)` is `sha256:<hex>` of a
file or `tree:<hex>` of a folder (sha256 over the sorted `relative path NUL file sha256`
lines; names starting with "." are skipped: temporaries, sidecars, hub metadata caches).

Hashing a 16 GB base model at every start would cost a minute, so file digests are
cached (`HashCache`) under a key of five stat fields and a sampled content digest:

    (size, mtime_ns, inode, ctime_ns, sha256 of the first, middle and last 64 KiB)

Why these and not size + mtime: `touch -d`/`os.utime` restore an mtime at will, so a
same-size rewrite with its old mtime passed the old key. ctime is set by the kernel on
every write or metadata change and cannot be set back from user space; a replacement by
rename (how `cp --preserve`, rsync, dvc checkout and our own atomic writes replace a file)
changes the inode. The sampled digest is three small reads per file (192 KiB, ~1 ms)
that also catch damage below the file system's bookkeeping (a raw-device write, a
snapshot restore that keeps the stat) in the header and tail, where a safetensors or
parquet file keeps its layout. A full re-hash on every read was rejected: the cache key
above leaves only a bit-flip in the unsampled middle of a file whose every stat field
was preserved, which nothing in user space can produce.
The cache is one JSON file, `$MARBLE_HASH_CACHE` or `~/.cache/marble/file-hashes.json`,
keyed by absolute path (a moved project re-hashes once); a cache that cannot be read or
written is no cache (everything is hashed), never an error.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from marble.runtime.io import write_json

SAMPLE = 64 << 10
CHUNK = 1 << 20
CACHE_ENV = "MARBLE_HASH_CACHE"


def default_cache_path() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "marble" / "file-hashes.json")


def sampled_digest(path: Path, size: int) -> str:
    """sha256 of the size and the first, middle and last SAMPLE bytes (all of a small file)."""
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as fh:
        for offset in sorted({0, max(0, size // 2 - SAMPLE // 2), max(0, size - SAMPLE)}):
            fh.seek(offset)
            digest.update(fh.read(SAMPLE))
    return digest.hexdigest()


def stat_key(path: Path) -> dict:
    """The cache key of a file: stat fields that any write moves, plus sampled content."""
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino,
            "ctime_ns": st.st_ctime_ns, "sampled": sampled_digest(path, st.st_size)}


def full_digests(path: Path) -> tuple[str, str]:
    """(sha256, git blob id) of a file, in one read."""
    sha256 = hashlib.sha256()
    blob = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(CHUNK), b""):
            sha256.update(block)
            blob.update(block)
    return sha256.hexdigest(), blob.hexdigest()


class HashCache:
    """Digests by file, valid while the file's `stat_key` is unchanged.

    `path`: the JSON file holding the records (default: `default_cache_path()`);
    `root`: when given, records are keyed by the path relative to it (a download
    folder's sidecar stays valid when the folder moves; the key still invalidates it);
    `autosave=False`: records are written by `save()` only (a caller hashing a whole tree
    saves once, not once per new file: the cache is rewritten whole at every save).
    """

    def __init__(self, path: str | Path | None = None, root: str | Path | None = None,
                 autosave: bool = True):
        self.path = Path(path) if path is not None else default_cache_path()
        self.root = Path(root) if root is not None else None
        self.autosave = autosave
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}  # absent or damaged: every file is hashed again, nothing is trusted
        self.records: dict[str, dict] = data if isinstance(data, dict) else {}

    def name(self, path: Path) -> str:
        if self.root is not None:
            return str(Path(path).relative_to(self.root))
        return str(Path(path).resolve())

    def save(self) -> None:
        try:
            write_json(self.path, self.records)
        except OSError:
            pass  # a read-only home or a full disk: hashing again next time is the cost

    def digests(self, path: Path) -> tuple[str, str]:
        """(sha256, git blob id) of `path`, from the cache while its key is unchanged."""
        path = Path(path)
        name, key = self.name(path), stat_key(path)
        record = self.records.get(name) or {}
        if all(record.get(k) == v for k, v in key.items()) and record.get("sha256") and record.get("git_blob"):
            return record["sha256"], record["git_blob"]
        sha256, blob = full_digests(path)
        self.records[name] = {**{k: v for k, v in record.items() if k == "verified"},
                              **key, "sha256": sha256, "git_blob": blob}
        if self.autosave:
            self.save()
        return sha256, blob

    def sha256(self, path: Path) -> str:
        return self.digests(path)[0]

    def record(self, path: Path) -> dict:
        return self.records.setdefault(self.name(Path(path)), {})


def tree_files(folder: Path) -> list[Path]:
    """The files a folder's fingerprint covers: all but names starting with "."."""
    return sorted(p for p in folder.rglob("*") if p.is_file()
                  and not any(part.startswith(".") for part in p.relative_to(folder).parts))


def fingerprint(path: str | Path, cache: HashCache | None = None) -> str:
    """`sha256:<hex>` of a file, `tree:<hex>` of a folder's files (FileNotFoundError if neither)."""
    path = Path(path).expanduser()
    cache = cache if cache is not None else HashCache()
    if path.is_file():
        return f"sha256:{cache.sha256(path)}"
    if path.is_dir():
        digest = hashlib.sha256()
        for f in tree_files(path):
            digest.update(f"{f.relative_to(path).as_posix()}\0{cache.sha256(f)}\n".encode())
        return f"tree:{digest.hexdigest()}"
    raise FileNotFoundError(f"{path}: no such file or folder to fingerprint")


def project_relative(path: str | Path, root: str | Path | None = None) -> str:
    """`path` relative to the project (the working folder) when inside it, else absolute:
    what identities record, so a moved or copied project names the same inputs."""
    resolved = Path(path).expanduser().resolve()
    base = Path(root or os.getcwd()).resolve()
    try:
        return resolved.relative_to(base).as_posix()
    except ValueError:
        return str(resolved)


def mismatched(folder: str | Path, recorded: dict[str, str], cache: HashCache | None = None) -> list[str]:
    """`name: why` for each file of `recorded` (name -> sha256) that is absent or differs."""
    cache = cache if cache is not None else HashCache()
    out = []
    for name, want in sorted(recorded.items()):
        path = Path(folder) / name
        if not path.is_file():
            out.append(f"{name}: missing")
            continue
        got = cache.sha256(path)
        if got != want:
            out.append(f"{name}: sha256 {got[:12]}..., recorded {want[:12]}...")
    return out
