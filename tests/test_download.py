"""Downloader against a local HTTP server (127.0.0.1, Range support); no network."""

from __future__ import annotations

import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from marble.assets.download import download
from marble.assets.download import main as download_main
from marble.assets.manifest import AccessDenied, DownloadError, Entry, load_manifest

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


def _offline_manifest(tmp_path):
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(
        "groups:\n"
        "  datasets:\n    dir: raw\n    files:\n"
        f"      - {{path: a.txt, url: 'http://x/a', size: 3, sha256: {hashlib.sha256(b'abc').hexdigest()}}}\n"
        f"      - {{path: b.txt, url: 'http://x/b', size: null, sha256: {hashlib.sha256(b'x').hexdigest()}}}\n"
        f"      - {{path: c.txt, url: 'http://x/c', size: 2, sha256: {hashlib.sha256(b'ok').hexdigest()}}}\n"
        "  rewards:\n    dir: ck\n    files:\n      - {path: r.pt, url: 'http://x/r', size: null, sha256: null}\n")
    return manifest


def test_offline_names_every_missing_file(tmp_path, capsys):
    manifest = _offline_manifest(tmp_path)
    out = tmp_path / "raw"  # --out is the group's own folder (the rule's output)
    out.mkdir()
    (out / "a.txt").write_text("abc")
    (out / "c.txt").write_text("too long")
    rc = download_main(["datasets", "--offline", "--out", str(out), "--manifest", str(manifest)])
    err = capsys.readouterr().err
    assert rc == 1
    assert "2 of 3 files unavailable" in err and f"{out}/b.txt (missing)" in err
    assert f"{out}/c.txt (size 8, pinned 2)" in err and "a.txt" not in err and "r.pt" not in err
    (out / "b.txt").write_text("x")
    (out / "c.txt").write_text("ok")
    assert download_main(["datasets", "--offline", "--out", str(out), "--manifest", str(manifest)]) == 0


def test_hf_hub_offline_means_check_only(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # as on a compute node: nothing is fetched
    rc = download_main(["datasets", "--out", str(tmp_path / "raw"), "--manifest", str(_offline_manifest(tmp_path))])
    assert rc == 1 and "3 of 3 files unavailable" in capsys.readouterr().err


def test_out_is_the_group_folder_and_root_holds_every_group(server, tmp_path):
    """The rule passes --out {output}: files land in it, not one folder deeper (issue 9)."""
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(
        "groups:\n"
        f"  datasets:\n    dir: raw\n    files:\n"
        f"      - {{path: p/t.bin, url: '{server}/file', size: {len(PAYLOAD)}, sha256: {SHA}}}\n"
        f"  rewards:\n    dir: ck\n    files:\n"
        f"      - {{path: r.bin, url: '{server}/file', size: null, sha256: {SHA}}}\n")
    out = tmp_path / "rule-output"
    assert download_main(["datasets", "--out", str(out), "--manifest", str(manifest)]) == 0
    assert (out / "p/t.bin").read_bytes() == PAYLOAD and not (out / "raw").exists()
    root = tmp_path / "data"
    assert download_main(["all", "--root", str(root), "--manifest", str(manifest)]) == 0
    assert (root / "raw/p/t.bin").is_file() and (root / "ck/r.bin").is_file()
    assert download_main(["all", "--out", str(root), "--manifest", str(manifest)]) == 1


def test_mirror_url_replaces_the_scheme_and_host(server, tmp_path, monkeypatch):
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text("groups:\n  datasets:\n    dir: raw\n    files:\n"
                        f"      - {{path: t.bin, url: 'https://example.org/file', size: null, sha256: {SHA}}}\n")
    monkeypatch.setenv("MARBLE_MIRROR", server + "/mirror")
    assert download_main(["datasets", "--out", str(tmp_path / "o"), "--manifest", str(manifest)]) == 0
    assert Handler.log[-1][0] == "/mirror/example.org/file"


@pytest.mark.parametrize("text,match", [
    ("groups:\n  model:\n    dri: x\n", r"groups.model: unknown key\(s\) \['dri'\]"),
    ("groups:\n  model:\n    hub:\n      - {repo: a/b, files: [{path: x, sha: 1}]}\n",
     r"groups.model.hub\[0\].files\[0\]: unknown key\(s\) \['sha'\]"),
    ("groups:\n  model:\n    files:\n      - {path: x}\n", r"groups.model.files\[0\] lacks \['url'\]"),
])
def test_manifest_errors_name_the_file_and_key(tmp_path, text, match):
    manifest = tmp_path / "m.yaml"
    manifest.write_text(text)
    with pytest.raises(DownloadError, match=match):
        load_manifest(manifest)


def test_packaged_manifest_covers_the_paper_assets(shared_dir):
    entries = load_manifest()
    assert {e.group for e in entries} == {"model", "rewards", "datasets"}
    assert all(e.url.startswith("https://") for e in entries if not e.repo)
    # hub entries: a pinned 40-hex commit each, never a moving ref
    assert all(e.revision and len(e.revision) == 40 and int(e.revision, 16) >= 0 for e in entries if e.repo)
    assert all(e.repo and e.gated and e.page for e in entries if e.group == "model")
    names = {e.path for e in entries if e.group == "rewards"}
    for needed in ("sac+logos+ava1-l14-linearMSE.pth", "HPS_v2.1_compressed.pt", "ImageReward.pt", "med_config.json",
                   "geneval/object_names.txt", "hub/yuvalkirstain/PickScore_v1/model.safetensors",
                   "hub/laion/CLIP-ViT-H-14-laion2B-s32B-b79K/preprocessor_config.json",
                   "hub/openai/clip-vit-large-patch14/model.safetensors",
                   "hub/google-bert/bert-base-uncased/vocab.txt",
                   "mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco_20220504_001756-743b7d99.pth"):
        assert needed in names, needed
    pinned = {e.path: e for e in entries if not e.repo and e.sha256}
    shared_files = {"geneval/object_names.txt": "geneval/object_names.txt"}
    shared_files.update({e.path: e.path for e in entries if e.group == "datasets" and e.sha256})
    assert len(shared_files) == 6
    for rel, shared_rel in shared_files.items():
        e = pinned[rel]
        data = (shared_dir / "datasets" / shared_rel).read_bytes()
        assert len(data) == e.size and hashlib.sha256(data).hexdigest() == e.sha256, e.path
