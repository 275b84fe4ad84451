"""`marble download {model,rewards,datasets} --out DIR` (or `all --root ROOT`): fetch the pinned inputs.

Every file is listed in a manifest (default: the packaged `manifest.yaml`). One group lands
directly in `--out DIR` (the folder a workflow rule names); `all` puts each group into
ROOT/<dir>. Plain-URL entries use this module: a download streams into `<file>.part`,
resumes it with an HTTP Range request after a dropped connection, retries with exponential
backoff, verifies size and sha256 (a mismatch removes the partial file), then renames it
into place atomically. `--mirror URL` (or MARBLE_MIRROR) fetches `https://host/path` from
`URL/host/path`. Hub entries go through huggingface_hub at a pinned commit
(`marble.assets.hub`; HF_ENDPOINT for a mirror, HF_TOKEN for the gated model).
A file already on disk counts as present only when its content matches its pin (re-hashed,
cached by size + mtime: `marble.assets.verify`); `--offline` (or HF_HUB_OFFLINE=1) downloads
nothing: it checks what is on disk the same way and names every missing or bad file.

Why not pooch: it cannot resume a partial download and would add a dependency for the
handful of plain URLs; this module is small, tested, and does size + sha256 + resume.
"""

from __future__ import annotations

import argparse
import http.client
import os
import sys
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

from tqdm.auto import tqdm

from marble.assets.hub import fetch_repo
from marble.assets.manifest import (
    GROUPS,
    MANIFEST,
    AccessDenied,
    DownloadError,
    Entry,
    group_dirs,
    load_manifest,
    missing_files,
    present,
)
from marble.assets.verify import HashCache, digests

CHUNK = 1 << 20


def mirrored(entry: Entry, mirror: str | None) -> Entry:
    """`https://host/path` -> `MIRROR/host/path` for plain-URL entries."""
    if not mirror or not entry.url:
        return entry
    rest = entry.url.split("://", 1)[-1]
    return replace(entry, url=f"{mirror.rstrip('/')}/{rest}")


def denied_message(entry: Entry, status: int) -> str:
    if entry.page:
        token = "HF_TOKEN is not set" if not os.environ.get("HF_TOKEN") else "HF_TOKEN was refused"
        return (f"{entry.url}: HTTP {status}, access denied ({token}). This model is gated: log in, "
                f"accept the licence at {entry.page}, create a read token at "
                f"https://huggingface.co/settings/tokens and export HF_TOKEN=<token>")
    return f"{entry.url}: HTTP {status}, access denied"


def _request(entry: Entry, offset: int) -> urllib.request.Request:
    req = urllib.request.Request(entry.url, headers={"User-Agent": "marble-download/0.1"})
    if offset:
        req.add_header("Range", f"bytes={offset}-")
    token = os.environ.get("HF_TOKEN")
    if entry.auth == "hf" and token:
        # unredirected: the token goes to the hub only, never to the CDN it redirects to
        req.add_unredirected_header("Authorization", f"Bearer {token}")
    return req


def _fetch_once(entry: Entry, part: Path, timeout: float) -> None:
    """One attempt: append to `part` from where it stopped; raises on a short read."""
    offset = part.stat().st_size if part.exists() else 0
    try:
        resp = urllib.request.urlopen(_request(entry, offset), timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise AccessDenied(denied_message(entry, exc.code)) from None
        if exc.code == 416 and offset:  # the partial file already holds every byte
            return
        raise
    with resp:
        resumed = resp.status == 206
        length = resp.headers.get("Content-Length")
        expected = offset + int(length) if resumed and length else (int(length) if length else None)
        with open(part, "ab" if resumed else "wb") as fh:
            bar = tqdm(total=expected, initial=offset if resumed else 0, unit="B", unit_scale=True,
                       desc=Path(entry.path).name, leave=False)
            for block in iter(lambda: resp.read(CHUNK), b""):
                fh.write(block)
                bar.update(len(block))
            bar.close()
            fh.flush()
            os.fsync(fh.fileno())
    if expected is not None and part.stat().st_size < expected:
        raise http.client.IncompleteRead(b"", expected - part.stat().st_size)


def _verify(entry: Entry, part: Path) -> str:
    def fail(what: str):
        part.unlink()
        raise DownloadError(f"{entry.path}: {what}; checksum error, partial file removed")

    size = part.stat().st_size
    if entry.size is not None and size != entry.size:
        fail(f"size {size} != pinned {entry.size}")
    digest, blob = digests(part)
    if entry.sha256 and digest != entry.sha256.lower():
        fail(f"sha256 {digest} != pinned {entry.sha256}")
    if entry.git_blob and blob != entry.git_blob.lower():
        fail(f"git blob {blob} != pinned {entry.git_blob}")
    if entry.sha256_prefix and not digest.startswith(entry.sha256_prefix.lower()):
        fail(f"sha256 {digest} does not start with the pinned {entry.sha256_prefix}")
    return digest


def download(entry: Entry, out: Path, retries: int = 5, backoff: float = 1.0, timeout: float = 60.0) -> str:
    """Fetch one entry into out/entry.path; returns 'present', 'downloaded' or 'unpinned'."""
    dest = out / entry.path
    if present(entry, out):
        return "present"
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    for attempt in range(retries + 1):
        try:
            _fetch_once(entry, part, timeout)
            break
        except AccessDenied:
            raise
        except urllib.error.HTTPError as exc:
            if exc.code < 500 and exc.code != 429:
                raise DownloadError(f"{entry.url}: HTTP {exc.code} {exc.reason}") from None
            error = exc
        except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError) as exc:
            error = exc
        if attempt == retries:
            raise DownloadError(f"{entry.url}: failed after {retries + 1} attempts: {error}")
        delay = backoff * 2**attempt
        print(f"{entry.path}: {error!r}; retry {attempt + 1}/{retries} in {delay:.1f}s", file=sys.stderr)
        time.sleep(delay)
    digest = _verify(entry, part)
    os.replace(part, dest)  # same folder: atomic
    HashCache(out).mark_verified(entry.path, dest)
    if entry.sha256 or entry.git_blob:
        return "downloaded"
    print(f"{entry.path}: not pinned; size {dest.stat().st_size}, sha256 {digest}: "
          f"pin these in the manifest", file=sys.stderr)
    return "unpinned"


def fetch_group(entries: list[Entry], out: Path, retries: int = 5, backoff: float = 1.0,
                mirror: str | None = None) -> list[tuple[str, Entry]]:
    """Plain URLs one by one, hub entries one repo@revision at a time."""
    results, repos = [], {}
    for e in entries:
        if e.repo:
            repos.setdefault((e.repo, e.revision), []).append(e)
        else:
            results.append((download(mirrored(e, mirror), out, retries, backoff), e))
    for repo_entries in repos.values():
        results.extend(fetch_repo(repo_entries, out))
    return results


def _targets(args, manifest: str) -> list[tuple[str, Path]]:
    """(group, folder) pairs: `--out` is the group's own folder, `--root` the parent of every group's dir."""
    if args.what == "all" and args.out:
        raise DownloadError("`marble download all` takes --root ROOT (each group goes to ROOT/<dir>), not --out")
    if not args.out and not args.root:
        raise DownloadError("give --out DIR (the group's folder) or --root ROOT")
    groups = GROUPS if args.what == "all" else (args.what,)
    dirs = group_dirs(manifest)
    return [(g, Path(args.out) if args.out else Path(args.root) / dirs.get(g, g)) for g in groups]


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="marble download", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=[*GROUPS, "all"])
    p.add_argument("--out", help="the group's folder: its files land directly in it")
    p.add_argument("--root", help="parent folder: each group goes to ROOT/<dir of the manifest>")
    p.add_argument("--offline", action="store_true",
                   help="download nothing; name missing files (also when HF_HUB_OFFLINE=1)")
    p.add_argument("--manifest", default=os.environ.get("MARBLE_MANIFEST") or str(MANIFEST),
                   help="default: $MARBLE_MANIFEST, else the packaged manifest")
    p.add_argument("--mirror", default=os.environ.get("MARBLE_MIRROR") or None,
                   help="fetch plain URLs https://host/path from MIRROR/host/path (default: $MARBLE_MIRROR); "
                        "hub files follow HF_ENDPOINT")
    p.add_argument("--retries", type=int, default=5)
    p.add_argument("--backoff", type=float, default=1.0, help="first retry delay (s), doubled each time")
    args = p.parse_args(argv)
    offline = args.offline or _truthy(os.environ.get("HF_HUB_OFFLINE"))
    try:
        entries = load_manifest(args.manifest)
        for group, out in _targets(args, args.manifest):
            chosen = [e for e in entries if e.group == group]
            if offline:
                bad = missing_files(chosen, out)
                if bad:
                    print(f"marble download --offline: {len(bad)} of {len(chosen)} files unavailable:\n  "
                          + "\n  ".join(bad), file=sys.stderr)
                    return 1
                print(f"all {len(chosen)} files present under {out}")
                continue
            for status, entry in fetch_group(chosen, out, args.retries, args.backoff, args.mirror):
                print(f"{status:>10}  {out / entry.path}")
    except DownloadError as exc:
        print(f"marble download: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
