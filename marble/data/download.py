"""`marble download {model,rewards,datasets,all} --out DIR`: fetch the pinned inputs.

Every file is listed in a manifest (default: the packaged `manifest.yaml`) with URL,
size and sha256. A download streams into `<file>.part`, resumes it with an HTTP Range
request after a dropped connection, retries with exponential backoff, verifies size and
sha256 (a mismatch removes the partial file), then renames it into place atomically.
`--offline` downloads nothing: it checks what is on disk and names every missing file.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import os
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml
from tqdm.auto import tqdm

MANIFEST = Path(__file__).with_name("manifest.yaml")
GROUPS = ("model", "rewards", "datasets")
CHUNK = 1 << 20


class DownloadError(RuntimeError):
    """A file could not be fetched or verified; the message names it."""


class AccessDenied(DownloadError):
    """HTTP 401/403 (a gated model without an accepted licence or a valid HF_TOKEN)."""


@dataclass
class Entry:
    group: str
    path: str  # relative to --out, including the group's dir
    url: str
    size: int | None
    sha256: str | None
    auth: str | None = None  # "hf": send HF_TOKEN
    page: str | None = None  # licence page of a gated model


def load_manifest(path: str | Path = MANIFEST) -> list[Entry]:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DownloadError(f"manifest {path} does not exist") from None
    entries = []
    for group, spec in (data or {}).get("groups", {}).items():
        for i, f in enumerate(spec.get("files") or []):
            missing = [k for k in ("path", "url") if not f.get(k)]
            if missing:
                raise DownloadError(f"{path}: groups.{group}.files[{i}] lacks {missing}")
            rel = f"{spec['dir']}/{f['path']}" if spec.get("dir") else f["path"]
            entries.append(Entry(group, rel, f["url"], f.get("size"), f.get("sha256"),
                                 f.get("auth", spec.get("auth")), f.get("page", spec.get("page"))))
    return entries


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


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
    size = part.stat().st_size
    if entry.size is not None and size != entry.size:
        part.unlink()
        raise DownloadError(f"{entry.path}: size {size} != pinned {entry.size}; partial file removed")
    digest = sha256_file(part)
    if entry.sha256 and digest != entry.sha256.lower():
        part.unlink()
        raise DownloadError(f"{entry.path}: sha256 {digest} != pinned {entry.sha256}; partial file removed")
    return digest


def download(entry: Entry, out: Path, retries: int = 5, backoff: float = 1.0, timeout: float = 60.0) -> str:
    """Fetch one entry into out/entry.path; returns 'present', 'downloaded' or 'unpinned'."""
    dest = out / entry.path
    if dest.is_file() and (entry.size is None or dest.stat().st_size == entry.size):
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
    if entry.sha256:
        return "downloaded"
    print(f"{entry.path}: not pinned; size {dest.stat().st_size}, sha256 {digest}: "
          f"pin these in the manifest", file=sys.stderr)
    return "unpinned"


def missing_files(entries: list[Entry], out: Path) -> list[str]:
    """Entries absent on disk (or of the wrong pinned size)."""
    bad = []
    for e in entries:
        dest = out / e.path
        if not dest.is_file():
            bad.append(f"{dest} (missing)")
        elif e.size is not None and dest.stat().st_size != e.size:
            bad.append(f"{dest} (size {dest.stat().st_size}, pinned {e.size})")
    return bad


def select(entries: list[Entry], what: str) -> list[Entry]:
    return entries if what == "all" else [e for e in entries if e.group == what]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="marble download", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=[*GROUPS, "all"])
    p.add_argument("--out", required=True, help="root folder (groups go to their `dir` below it)")
    p.add_argument("--offline", action="store_true", help="download nothing; name missing files")
    p.add_argument("--manifest", default=str(MANIFEST))
    p.add_argument("--retries", type=int, default=5)
    p.add_argument("--backoff", type=float, default=1.0, help="first retry delay (s), doubled each time")
    args = p.parse_args(argv)
    out = Path(args.out)
    try:
        entries = select(load_manifest(args.manifest), args.what)
        if args.offline:
            bad = missing_files(entries, out)
            if bad:
                print(f"marble download --offline: {len(bad)} of {len(entries)} files unavailable:\n  "
                      + "\n  ".join(bad), file=sys.stderr)
                return 1
            print(f"all {len(entries)} files present under {out}")
            return 0
        for entry in entries:
            status = download(entry, out, args.retries, args.backoff)
            print(f"{status:>10}  {out / entry.path}")
    except DownloadError as exc:
        print(f"marble download: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
