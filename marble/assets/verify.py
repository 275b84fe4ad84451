"""Whether a downloaded file is the pinned one: re-hashed, not sized.

A file on disk counts as present only when its content matches its pin: `sha256` (and
`size`), or `git_blob` (the git blob id of the file in the pinned commit's tree, which
commits to the size too), or `sha256_prefix` (openmmlab's checkpoints carry the first 8 hex
of their sha256 in their name, the only pin published for them), or, for a hub file whose
manifest entry has no sha256, the digest recorded when it was verified against the hub's
listing at the pinned commit. Online and `--offline` alike.

Hashing gigabytes on every check would be slow, so each folder keeps a sidecar
`.marble-verified.json`: path -> {stat key, sha256, git_blob, verified}. The key is
marble.runtime.fingerprint's (size, mtime_ns, inode, ctime_ns and a sampled content
digest), not size + mtime: a same-size rewrite that restores its mtime still moves ctime,
so it is hashed again. `verified` is the sha256 a hub file had when its listing confirmed
it: the reference for later checks when the manifest pins none.
"""

from __future__ import annotations

from pathlib import Path

from marble.runtime import fingerprint

SIDECAR = ".marble-verified.json"


def digests(path: Path) -> tuple[str, str]:
    """(sha256, git blob id) of a file, in one read."""
    return fingerprint.full_digests(Path(path))


class HashCache:
    """The sidecar of one download folder (read once, written after each change)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.path = self.folder / SIDECAR
        self._cache = fingerprint.HashCache(self.path, root=self.folder)
        self.records = self._cache.records

    def _save(self) -> None:
        if self.path.parent.is_dir():
            self._cache.save()

    def digests(self, rel: str, path: Path) -> tuple[str, str]:
        """(sha256, git blob id) of out/rel, from the cache while its stat key is unchanged."""
        if not self.path.parent.is_dir():
            return digests(path)
        return self._cache.digests(self.folder / rel)

    def mark_verified(self, rel: str, path: Path) -> None:
        """Record out/rel's current sha256 as the verified one (after a check against a pin or listing)."""
        sha256, _ = self.digests(rel, path)
        self.records.setdefault(rel, {})["verified"] = sha256
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
