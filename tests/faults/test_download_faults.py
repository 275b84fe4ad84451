"""Downloads verified, not sized: a file on disk is re-hashed against its pin before it counts
as present (online and --offline); the hash is cached by size + mtime; the packaged manifest
pins every entry to a commit and a digest."""

from __future__ import annotations

import hashlib
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from marble.assets import verify
from marble.assets.download import download
from marble.assets.download import main as download_main
from marble.assets.manifest import DownloadError, Entry, load_manifest

PAYLOAD = b"pinned bytes\n" * 1000
SHA = hashlib.sha256(PAYLOAD).hexdigest()
BLOB = hashlib.sha1(b"blob %d\0" % len(PAYLOAD) + PAYLOAD).hexdigest()


class Handler(BaseHTTPRequestHandler):
    gets = 0

    def log_message(self, *args):
        pass

    def do_GET(self):
        Handler.gets += 1
        self.send_response(200)
        self.send_header("Content-Length", str(len(PAYLOAD)))
        self.end_headers()
        self.wfile.write(PAYLOAD)


@pytest.fixture
def server():
    Handler.gets = 0
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/file"
    httpd.shutdown()
    httpd.server_close()


def same_size_corruption(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def manifest(tmp_path, pin: str) -> str:
    path = tmp_path / "manifest.yaml"
    path.write_text(f"groups:\n  datasets:\n    dir: raw\n    files:\n"
                    f"      - {{path: d/p.txt, url: 'http://127.0.0.1:9/p', {pin}}}\n")
    return str(path)


def test_a_same_size_corrupt_file_is_fetched_again_not_present(server, tmp_path):
    e = Entry("datasets", "p.txt", server, len(PAYLOAD), SHA)
    assert download(e, tmp_path) == "downloaded"
    same_size_corruption(tmp_path / "p.txt")
    assert download(e, tmp_path) == "downloaded" and Handler.gets == 2  # never "present"
    assert (tmp_path / "p.txt").read_bytes() == PAYLOAD
    assert download(e, tmp_path) == "present" and Handler.gets == 2


@pytest.mark.parametrize("pin", [f"size: {len(PAYLOAD)}, sha256: {SHA}", f"git_blob: {BLOB}"])
def test_offline_reports_a_same_size_corrupt_file_with_its_path(tmp_path, capsys, pin):
    out = tmp_path / "raw"
    (out / "d").mkdir(parents=True)
    (out / "d" / "p.txt").write_bytes(PAYLOAD)
    args = ["datasets", "--offline", "--out", str(out), "--manifest", manifest(tmp_path, pin)]
    assert download_main(args) == 0
    same_size_corruption(out / "d" / "p.txt")
    assert download_main(args) == 1
    err = capsys.readouterr().err
    assert f"{out}/d/p.txt (" in err and ("sha256" in err or "git blob" in err)


def test_an_empty_or_unverified_file_is_not_present(tmp_path):
    hub_file = Entry("rewards", "m.bin", None, None, None, repo="a/b", revision="0" * 40, remote="m.bin")
    (tmp_path / "m.bin").write_bytes(b"")
    assert verify.problem(hub_file, tmp_path) == "empty"
    (tmp_path / "m.bin").write_bytes(b"weights")  # never verified against the hub's listing
    assert "no verified download on record" in verify.problem(hub_file, tmp_path)
    verify.HashCache(tmp_path).mark_verified("m.bin", tmp_path / "m.bin")
    assert verify.problem(hub_file, tmp_path) is None
    (tmp_path / "m.bin").write_bytes(b"weightz")  # changed since it was verified
    assert "verified as" in verify.problem(hub_file, tmp_path)


def test_the_hash_is_cached_by_stat_and_sampled_content(tmp_path, monkeypatch):
    """Cached while size, mtime, inode, ctime and the sampled bytes are unchanged; a same-size
    corruption whose mtime was put back (size + mtime alone were fooled) is hashed again."""
    from marble.runtime import fingerprint

    calls = []
    real = fingerprint.full_digests
    monkeypatch.setattr(fingerprint, "full_digests", lambda path: calls.append(path) or real(path))
    e = Entry("datasets", "p.txt", "http://127.0.0.1:9/p", len(PAYLOAD), SHA)
    (tmp_path / "p.txt").write_bytes(PAYLOAD)
    assert verify.problem(e, tmp_path) is None and verify.problem(e, tmp_path) is None
    assert len(calls) == 1  # the second check read the sidecar
    stat = (tmp_path / "p.txt").stat()
    same_size_corruption(tmp_path / "p.txt")
    os.utime(tmp_path / "p.txt", ns=(stat.st_atime_ns, stat.st_mtime_ns))  # mtime restored
    assert verify.problem(e, tmp_path).startswith("sha256") and len(calls) == 2


def test_a_wrong_git_blob_or_sha256_prefix_is_rejected_on_download(server, tmp_path):
    with pytest.raises(DownloadError, match="git blob"):
        download(Entry("datasets", "p.txt", server, None, None, git_blob="0" * 40), tmp_path)
    with pytest.raises(DownloadError, match="does not start with the pinned"):
        download(Entry("datasets", "p.txt", server, None, None, sha256_prefix="ffffffff"), tmp_path)
    assert not (tmp_path / "p.txt").exists()
    assert download(Entry("datasets", "p.txt", server, None, None, git_blob=BLOB), tmp_path) == "downloaded"


def test_every_packaged_entry_is_pinned_to_a_commit_and_a_digest():
    for e in load_manifest():
        if e.repo:
            assert e.revision and len(e.revision) == 40, e.path
            continue
        assert "/main/" not in e.url and "refs/heads" not in e.url, e.url
        assert (e.sha256 and e.size) or e.git_blob or e.sha256_prefix or e.unpinned_reason, e.path
    # The exceptions are named, with their reason: today only PaddleOCR's three model tars.
    exceptions = sorted(e.path for e in load_manifest() if not e.repo and e.unpinned_reason)
    assert exceptions == [f"paddleocr/{n}" for n in sorted(
        ["en_PP-OCRv3_det_infer.tar", "en_PP-OCRv4_rec_infer.tar", "ch_ppocr_mobile_v2.0_cls_infer.tar"])]
    pth = {e.path: e for e in load_manifest()}["sac+logos+ava1-l14-linearMSE.pth"]
    assert pth.size == 3714759 and pth.sha256.startswith("21dd590f")


REPO, REV = "google-bert/bert-base-uncased", "86b5e0934494bd15c9632b12f734a8a67f723594"


@pytest.fixture
def hub_mirror(tmp_path, monkeypatch):
    """A one-repo hub on 127.0.0.1 (beds.mirror_server) and a manifest naming it
    without sha256 pins: its files are verified against the hub's listing only."""
    import json

    import huggingface_hub.constants as hf_constants

    from beds.mirror_server import MirrorServer

    root = tmp_path / "mirror"
    (root / "hub" / REPO).mkdir(parents=True)
    (root / "hub" / REPO / "vocab.txt").write_text("[PAD]\n[UNK]\nhello\n" * 50)
    (root / "mirror.json").write_text(json.dumps({"repos": {REPO: {"revision": REV, "gated": False}}}))
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(f"groups:\n  rewards:\n    dir: ck\n    hub:\n      - repo: {REPO}\n"
                        f"        revision: {REV}\n        files:\n          - {{path: vocab.txt}}\n")
    monkeypatch.setattr(hf_constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE", "MARBLE_MIRROR"):
        monkeypatch.delenv(name, raising=False)
    with MirrorServer(root, idle_s=60) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield str(manifest), root / "hub" / REPO / "vocab.txt"


def test_a_hub_file_is_checked_against_the_listing_and_a_corrupt_one_fetched_again(hub_mirror, tmp_path, capsys):
    manifest, served = hub_mirror
    out = tmp_path / "ck"
    args = ["rewards", "--out", str(out), "--manifest", manifest]
    assert download_main(args) == 0 and (out / "vocab.txt").read_bytes() == served.read_bytes()
    (out / verify.SIDECAR).unlink()  # a file from before hashes were recorded
    assert download_main([*args, "--offline"]) == 1  # offline, nothing to check it against
    assert download_main(args) == 0 and "present" in capsys.readouterr().out  # the listing confirms it
    assert download_main([*args, "--offline"]) == 0
    same_size_corruption(out / "vocab.txt")
    assert download_main([*args, "--offline"]) == 1
    assert f"{out}/vocab.txt (sha256" in capsys.readouterr().err
    assert download_main(args) == 0 and (out / "vocab.txt").read_bytes() == served.read_bytes()
