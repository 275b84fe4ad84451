"""Downloader against a local HTTP server (127.0.0.1, Range support); no network."""

from __future__ import annotations

import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from marble.data.download import (
    AccessDenied,
    DownloadError,
    Entry,
    download,
    load_manifest,
    main as download_main,
)

PAYLOAD = bytes(range(256)) * 400  # 102,400 bytes
SHA = hashlib.sha256(PAYLOAD).hexdigest()


class Handler(BaseHTTPRequestHandler):
    log: list = []
    drops: dict = {}  # path -> how many responses to cut short

    def log_message(self, *args):  # keep pytest output clean
        pass

    def do_GET(self):
        self.log.append((self.path, self.headers.get("Range"), self.headers.get("Authorization")))
        if self.path == "/forbidden":
            return self._status(403)
        if self.path == "/gated" and self.headers.get("Authorization") != "Bearer good-token":
            return self._status(401)
        start = 0
        if self.headers.get("Range"):
            start = int(self.headers["Range"].split("=")[1].rstrip("-"))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(PAYLOAD) - 1}/{len(PAYLOAD)}")
        else:
            self.send_response(200)
        body = PAYLOAD[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.drops.get(self.path, 0) > 0:
            self.drops[self.path] -= 1
            self.wfile.write(body[: len(body) // 3])  # then the connection drops
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)

    def _status(self, code):
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture
def server():
    Handler.log, Handler.drops = [], {}
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def entry(url, sha=SHA, size=len(PAYLOAD), **kw):
    return Entry("model", "m/weights.bin", url, size, sha, **kw)


def test_resume_after_a_dropped_connection(server, tmp_path):
    Handler.drops["/file"] = 2
    status = download(entry(server + "/file"), tmp_path, retries=3, backoff=0)
    assert status == "downloaded"
    assert (tmp_path / "m/weights.bin").read_bytes() == PAYLOAD
    assert not (tmp_path / "m/weights.bin.part").exists()
    ranges = [r for path, r, _ in Handler.log]
    first_cut = len(PAYLOAD) // 3
    second_cut = first_cut + (len(PAYLOAD) - first_cut) // 3
    assert ranges == [None, f"bytes={first_cut}-", f"bytes={second_cut}-"]
    # a second call finds the file and fetches nothing
    assert download(entry(server + "/file"), tmp_path, backoff=0) == "present"
    assert len(Handler.log) == 3


def test_gives_up_after_the_retries(server, tmp_path):
    Handler.drops["/file"] = 5
    with pytest.raises(DownloadError, match="failed after 2 attempts"):
        download(entry(server + "/file"), tmp_path, retries=1, backoff=0)


def test_checksum_mismatch_is_rejected_and_partial_removed(server, tmp_path):
    with pytest.raises(DownloadError, match="sha256 .* != pinned 0000"):
        download(entry(server + "/file", sha="0" * 64), tmp_path, backoff=0)
    assert not (tmp_path / "m/weights.bin").exists()
    assert not (tmp_path / "m/weights.bin.part").exists()
    with pytest.raises(DownloadError, match="size 102400 != pinned 5"):
        download(entry(server + "/file", size=5), tmp_path, backoff=0)
    assert not (tmp_path / "m/weights.bin.part").exists()


def test_unpinned_file_prints_its_digest(server, tmp_path, capsys):
    assert download(entry(server + "/file", sha=None, size=None), tmp_path) == "unpinned"
    assert SHA in capsys.readouterr().err


@pytest.mark.parametrize("path,code", [("/gated", 401), ("/forbidden", 403)])
def test_denied_access_gives_the_gated_model_message(server, tmp_path, monkeypatch, path, code):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    page = "https://huggingface.co/stabilityai/stable-diffusion-3.5-medium"
    with pytest.raises(AccessDenied) as info:
        download(entry(server + path, auth="hf", page=page), tmp_path, retries=3, backoff=0)
    msg = str(info.value)
    assert f"HTTP {code}" in msg and f"accept the licence at {page}" in msg and "HF_TOKEN" in msg
    assert len(Handler.log) == 1  # no retries on a denial
    assert not (tmp_path / "m/weights.bin").exists()


def test_hf_token_is_sent_to_gated_entries_only(server, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "good-token")
    assert download(entry(server + "/gated", auth="hf", page="p"), tmp_path, backoff=0) == "downloaded"
    assert Handler.log[-1][2] == "Bearer good-token"
    download(Entry("rewards", "r.bin", server + "/file", None, SHA), tmp_path)
    assert Handler.log[-1][2] is None


def test_offline_names_every_missing_file(tmp_path, capsys):
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(
        "groups:\n"
        "  datasets:\n    dir: raw\n    files:\n"
        "      - {path: a.txt, url: 'http://x/a', size: 3, sha256: null}\n"
        "      - {path: b.txt, url: 'http://x/b', size: null, sha256: null}\n"
        "      - {path: c.txt, url: 'http://x/c', size: 2, sha256: null}\n"
        "  rewards:\n    dir: ck\n    files:\n      - {path: r.pt, url: 'http://x/r', size: null, sha256: null}\n")
    out = tmp_path / "out"
    (out / "raw").mkdir(parents=True)
    (out / "raw/a.txt").write_text("abc")
    (out / "raw/c.txt").write_text("too long")
    rc = download_main(["datasets", "--offline", "--out", str(out), "--manifest", str(manifest)])
    err = capsys.readouterr().err
    assert rc == 1
    assert "2 of 3 files unavailable" in err and "raw/b.txt (missing)" in err
    assert "raw/c.txt (size 8, pinned 2)" in err and "a.txt" not in err and "r.pt" not in err
    (out / "raw/b.txt").write_text("x")
    (out / "raw/c.txt").write_text("ok")
    assert download_main(["datasets", "--offline", "--out", str(out), "--manifest", str(manifest)]) == 0


def test_packaged_manifest_pins_the_shared_datasets(shared_dir):
    entries = load_manifest()
    groups = {e.group for e in entries}
    assert groups == {"model", "rewards", "datasets"}
    assert all(e.url.startswith("https://") for e in entries)
    names = {e.path.rsplit("/", 1)[-1] for e in entries if e.group == "rewards"}
    assert names == {"sac+logos+ava1-l14-linearMSE.pth", "open_clip_pytorch_model.bin", "HPS_v2.1_compressed.pt",
                     "mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco_20220504_001756-743b7d99.pth"}
    assert all(e.page and e.auth == "hf" for e in entries if e.group == "model")
    pinned = [e for e in entries if e.group == "datasets" and e.sha256]
    assert len(pinned) == 5
    for e in pinned:
        data = (shared_dir / "datasets" / e.path.removeprefix("raw/")).read_bytes()
        assert len(data) == e.size and hashlib.sha256(data).hexdigest() == e.sha256, e.path
