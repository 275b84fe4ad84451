"""A loopback HTTP server for a mirror folder (`python -m beds.mirror_server DIR`).

Serves, on 127.0.0.1 and a free port, what `beds.mirror` wrote:
- plain-URL assets at `/<host>/<path>` (what `marble download --mirror URL` requests);
- Hub repositories at the endpoints huggingface_hub calls through HF_ENDPOINT (checked
  against huggingface_hub 2.4's source): `GET /api/models/{repo}/revision/{rev}` (repo info,
  siblings with size, blobId and LFS sha256), `GET /api/models/{repo}/tree/{rev}[/{path}]`
  (the listing snapshot_download reads) and `HEAD|GET /{repo}/resolve/{rev}/{path}` with
  `X-Repo-Commit`, `ETag` (LFS sha256, else the git blob id), `X-Linked-Etag`/`X-Linked-Size`,
  `Content-Length`, `Accept-Ranges` and Range requests.
A gated repo answers 401 `X-Error-Code: GatedRepo` to file requests without a bearer token,
as the hub does. Hashes are computed from the files as served, so a file corrupted on disk is
served with its own (wrong) digest and only the client's pinned checksum can catch it.
The server is bounded: it stops by itself after `idle_s` seconds without a request.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".model", ".msgpack", ".onnx", ".h5")
INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/revision/(?P<rev>[^/]+)$")
TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$")
RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
CHUNK = 1 << 16


class Mirror:
    """The folder: mirror.json (repo -> revision, gated), hub/<repo>/..., urls/<host>/...."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        meta = json.loads((self.root / "mirror.json").read_text(encoding="utf-8"))
        self.repos: dict[str, dict] = meta["repos"]
        self._hashes: dict[tuple, tuple[str, str]] = {}
        self._lock = threading.Lock()

    def repo_dir(self, repo: str) -> Path:
        return self.root / "hub" / repo

    def files(self, repo: str) -> list[str]:
        base = self.repo_dir(repo)
        return sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file())

    def hashes(self, path: Path) -> tuple[str, str]:
        """(sha256, git blob sha1) of a file, cached by (path, size, mtime)."""
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns)
        with self._lock:
            if key not in self._hashes:
                data = path.read_bytes()
                blob = hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()
                self._hashes[key] = (hashlib.sha256(data).hexdigest(), blob)
            return self._hashes[key]

    def entry(self, repo: str, name: str) -> dict:
        """One file as the hub lists it (tree and siblings share these fields)."""
        path = self.repo_dir(repo) / name
        sha256, blob = self.hashes(path)
        size = path.stat().st_size
        lfs = {"size": size, "sha256": sha256, "oid": sha256, "pointerSize": 134} if is_lfs(name) else None
        return {"path": name, "size": size, "oid": blob, "lfs": lfs}

    def commit(self, repo: str, rev: str) -> str | None:
        """The pinned commit if `rev` names it (or is `main`), else None."""
        pinned = self.repos[repo]["revision"]
        return pinned if rev in (pinned, "main") else None


def is_lfs(name: str) -> bool:
    return name.endswith(LFS_SUFFIXES)


class Handler(BaseHTTPRequestHandler):
    mirror: Mirror
    server_version = "marble-mirror/0.1"
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet: tests read their own logs
        pass

    def do_HEAD(self):
        self._route(head=True)

    def do_GET(self):
        self._route(head=False)

    # -- routing -------------------------------------------------------------
    def _route(self, head: bool) -> None:
        self.server.touch()  # type: ignore[attr-defined]
        url = urlsplit(self.path)
        path, query = unquote(url.path), parse_qs(url.query)
        for pattern, handler in ((INFO, self._info), (TREE, self._tree), (RESOLVE, self._resolve)):
            match = pattern.match(path)
            if match and match["repo"] in self.mirror.repos:
                return handler(head=head, query=query, **match.groupdict())
        return self._static(path, head)

    def _error(self, code: int, error_code: str | None = None, message: str = "", commit: str | None = None):
        body = json.dumps({"error": message or error_code or str(code)}).encode()
        self.send_response(code)
        if error_code:
            self.send_header("X-Error-Code", error_code)
            self.send_header("X-Error-Message", message or error_code)
        if commit:
            self.send_header("X-Repo-Commit", commit)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, payload, head: bool) -> None:
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    # -- hub endpoints -------------------------------------------------------
    def _info(self, repo, rev, head, query):
        commit = self.mirror.commit(repo, rev)
        if commit is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        siblings = []
        for name in self.mirror.files(repo):
            e = self.mirror.entry(repo, name)
            siblings.append({"rfilename": name, "size": e["size"], "blobId": e["oid"], "lfs": e["lfs"]})
        gated = "manual" if self.mirror.repos[repo].get("gated") else False
        self._json({"_id": repo, "id": repo, "modelId": repo, "sha": commit, "private": False, "gated": gated,
                    "disabled": False, "tags": [], "siblings": siblings}, head)

    def _tree(self, repo, rev, head, query, path=None):
        commit = self.mirror.commit(repo, rev)
        if commit is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        prefix = (path or "").strip("/")
        recursive = (query.get("recursive") or ["false"])[0].lower() in ("1", "true")
        items, folders = [], set()
        for name in self.mirror.files(repo):
            if prefix and not name.startswith(prefix + "/"):
                continue
            rest = name[len(prefix) + 1 :] if prefix else name
            if not recursive and "/" in rest:
                folders.add(((prefix + "/") if prefix else "") + rest.split("/", 1)[0])
                continue
            e = self.mirror.entry(repo, name)
            items.append({"type": "file", **{k: v for k, v in e.items() if v is not None}})
        items += [{"type": "directory", "path": f, "oid": "0" * 40, "size": 0} for f in sorted(folders)]
        self._json(items, head)

    def _resolve(self, repo, rev, path, head, query):
        commit = self.mirror.commit(repo, rev)
        if commit is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        if self.mirror.repos[repo].get("gated") and not self.headers.get("Authorization", "").startswith("Bearer "):
            return self._error(401, "GatedRepo", f"Access to model {repo} is restricted. You must have access "
                               "to it and be authenticated to access it.", commit)
        file = self.mirror.repo_dir(repo) / path
        if not file.is_file() or ".." in Path(path).parts:
            return self._error(404, "EntryNotFound", f"{path} does not exist at {commit}", commit)
        sha256, blob = self.mirror.hashes(file)
        etag = sha256 if is_lfs(path) else blob
        extra = {"X-Repo-Commit": commit, "ETag": f'"{etag}"'}
        if is_lfs(path):
            extra.update({"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(file.stat().st_size)})
        self._send_file(file, head, extra)

    # -- plain files -----------------------------------------------------------
    def _static(self, path: str, head: bool):
        parts = [p for p in path.split("/") if p]
        file = self.mirror.root / "urls" / Path(*parts) if parts else None
        if file is None or ".." in parts or not file.is_file():
            return self._error(404, message=f"{path} is not in the mirror")
        self._send_file(file, head, {})

    def _send_file(self, file: Path, head: bool, extra: dict[str, str]):
        size = file.stat().st_size
        start = 0
        rng = re.match(r"bytes=(\d+)-$", self.headers.get("Range", ""))
        if rng and int(rng[1]) >= size:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if rng:
            start = int(rng[1])
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        else:
            self.send_response(200)
        for key, value in extra.items():
            self.send_header(key, value)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(size - start))
        self.end_headers()
        if head:
            return
        with open(file, "rb") as fh:
            fh.seek(start)
            for block in iter(lambda: fh.read(CHUNK), b""):
                self.wfile.write(block)


class LoopbackServer(ThreadingHTTPServer):
    """A threaded HTTP server on 127.0.0.1 that stops itself after `idle_s` without a request
    (handlers call `server.touch()`): test servers bounded in time. `with` runs it in a thread."""

    daemon_threads = True

    def __init__(self, handler, port: int = 0, idle_s: float = 300.0):
        super().__init__(("127.0.0.1", port), handler)
        self.idle_s, self._last = idle_s, time.monotonic()
        self._thread: threading.Thread | None = None

    def touch(self) -> None:
        self._last = time.monotonic()

    def service_actions(self) -> None:
        # Called by serve_forever between polls: stop once idle for idle_s.
        if time.monotonic() - self._last > self.idle_s:
            threading.Thread(target=self.shutdown, daemon=True).start()

    def start(self):
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class MirrorServer(LoopbackServer):
    def __init__(self, root: str | Path, port: int = 0, idle_s: float = 300.0):
        super().__init__(type("BoundHandler", (Handler,), {"mirror": Mirror(root)}), port, idle_s)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m beds.mirror_server", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("root", help="a folder written by `python -m beds.mirror`")
    p.add_argument("--port", type=int, default=0, help="0: a free port")
    p.add_argument("--idle", type=float, default=600.0, help="stop after this many seconds without a request")
    p.add_argument("--url-file", help="write the server's URL to this file once it listens")
    args = p.parse_args(argv)
    server = MirrorServer(args.root, args.port, args.idle)
    print(f"mirror {args.root} at {server.url} (HF_ENDPOINT={server.url} MARBLE_MIRROR={server.url}); "
          f"stops after {args.idle:.0f}s idle", flush=True)
    if args.url_file:
        Path(args.url_file).write_text(server.url + "\n", encoding="utf-8")
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
