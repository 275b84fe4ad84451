"""Whether a downloaded file is the pinned one: re-hashed, not sized.

A file on disk counts as present only when its content matches its pin: `sha256` (and
`size`), or `git_blob` (the git blob id of the file in the pinned commit's tree, which
commits to the size too), or `sha256_prefix` (openmmlab's checkpoints carry the first 8 hex
of their sha256 in their name, the only pin published for them), or, for a hub file whose
manifest entry has no sha256, the digest recorded when it was verified against the hub's
listing at the pinned commit. Online and `--offline` alike.

Hashing gigabytes on every check would be slow, so each folder keeps a sidecar
`.marble-verified.json`: path -> {size, mtime_ns, sha256, git_blob, verified}. A file whose
size and mtime_ns equal the cached ones reuses the cached digests; any write to it (which
moves mtime) makes the next check hash it again. `verified` is the sha256 a hub file had
when its listing confirmed it: the reference for later checks when the manifest pins none.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from marble.runtime.io import write_json

SIDECAR = ".marble-verified.json"
CHUNK = 1 << 20


def digests(path: Path) -> tuple[str, str]:
    """(sha256, git blob id) of a file, in one read."""
    sha256 = hashlib.sha256()
    blob = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(CHUNK), b""):
            sha256.update(block)
            blob.update(block)
    return sha256.hexdigest(), blob.hexdigest()


class HashCache:
    """The sidecar of one download folder (read once, written after each change)."""

    def __init__(self, folder: Path):
        self.path = Path(folder) / SIDECAR
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}  # absent or damaged: every file is hashed again, nothing is trusted
        self.records: dict[str, dict] = data if isinstance(data, dict) else {}

    def _save(self) -> None:
        if self.path.parent.is_dir():
            write_json(self.path, self.records)

    def digests(self, rel: str, path: Path) -> tuple[str, str]:
        """(sha256, git blob id) of out/rel, from the cache while size and mtime are unchanged."""
        stat = path.stat()
        record = self.records.get(rel) or {}
        if record.get("size") == stat.st_size and record.get("mtime_ns") == stat.st_mtime_ns \
                and record.get("sha256") and record.get("git_blob"):
            return record["sha256"], record["git_blob"]
        sha256, blob = digests(path)
        self.records[rel] = {**record, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                             "sha256": sha256, "git_blob": blob}
        self._save()
        return sha256, blob

    def mark_verified(self, rel: str, path: Path) -> None:
        """Record out/rel's current sha256 as the verified one (after a check against a pin or listing)."""
        sha256, _ = self.digests(rel, path)
        self.records[rel]["verified"] = sha256
        self._save()

    def verified(self, rel: str) -> str | None:
        return (self.records.get(rel) or {}).get("verified")


def problem(entry, out: Path, cache: HashCache | None = None) -> str | None:
    """Why out/entry.path does not count as present (None: it matches its pin)."""
    path = Path(out) / entry.path
    if not path.is_file():
        return "missing"
    size = path.stat().st_size
    if entry.size is not None and size != entry.size:
        return f"size {size}, pinned {entry.size}"
    if size == 0:
        return "empty"
    cache = cache or HashCache(out)
    sha256, blob = cache.digests(entry.path, path)
    if entry.sha256:
        return None if sha256 == entry.sha256.lower() else f"sha256 {sha256}, pinned {entry.sha256}"
    if entry.git_blob:
        return None if blob == entry.git_blob.lower() else f"git blob {blob}, pinned {entry.git_blob}"
    recorded = cache.verified(entry.path)
    if entry.sha256_prefix and not sha256.startswith(entry.sha256_prefix.lower()):
        return f"sha256 {sha256}, pinned prefix {entry.sha256_prefix}"
    if entry.sha256_prefix and not recorded:
        return None  # the prefix is all that is published for it
    if recorded:
        return None if sha256 == recorded else f"sha256 {sha256}, verified as {recorded} when downloaded"
    return "no pin and no verified download on record (run `marble download` online)"
