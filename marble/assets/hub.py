"""Hugging Face Hub assets: pinned-commit downloads and the hub id -> local folder mapping.

Downloads go through huggingface_hub (`model_info` for the listing at the pinned commit,
`snapshot_download` for the bytes: its endpoint, auth and in-call Range resume), into a
staging folder beside the destination; each file is then verified (size; sha256 of LFS
files or the git blob id of small ones, from the hub's listing at that commit; the
manifest's own `size`/`sha256` when pinned) and renamed into place, so a file that fails a
check never reaches its final path. HF_ENDPOINT points at a mirror, HF_TOKEN authenticates.

Scorers call `local_model(hub_id)` so that compute nodes read the downloaded folders and
never reach the hub at run time.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import sys
from pathlib import Path

from marble.assets.manifest import (
    DOWNLOAD_HINT,
    MANIFEST,
    AccessDenied,
    DownloadError,
    load_manifest,
    present,
)
from marble.assets.hub_ref import HubRefError, parse_hub_ref, pinned_revision
from marble.assets.manifest import ckpt_dir as resolve_ckpt_dir
from marble.assets.verify import HashCache
from marble.runtime.io import sha256_file

OFFICIAL_ENDPOINT = "https://huggingface.co"
STAGING = ".marble-download"
# Hub ids as the scorers (and third-party code such as ImageReward) spell them.
ALIASES = {"bert-base-uncased": "google-bert/bert-base-uncased", "THUDM/ImageReward": "zai-org/ImageReward"}


def endpoint() -> str:
    """HF_ENDPOINT read at call time (huggingface_hub reads it once, at import)."""
    return (os.environ.get("HF_ENDPOINT") or OFFICIAL_ENDPOINT).rstrip("/")


def has_token() -> bool:
    from huggingface_hub import get_token

    return bool(os.environ.get("HF_TOKEN") or get_token())


def gated_message(repo: str, page: str | None, detail: str = "") -> str:
    token = "HF_TOKEN was refused" if has_token() else "HF_TOKEN is not set"
    return (f"{repo}: access denied ({token}){detail}. This model is gated: log in, accept the licence at "
            f"{page or OFFICIAL_ENDPOINT + '/' + repo}, create a read token at "
            f"https://huggingface.co/settings/tokens and export HF_TOKEN=<token>")


def git_blob_sha1(path: Path) -> str:
    """The git blob id of a file (what the hub lists for files stored without LFS)."""
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check(entry, staged: Path, sibling) -> str:
    """Verify one staged file; on any mismatch remove it and raise naming the file."""
    def fail(what: str):
        staged.unlink(missing_ok=True)
        raise DownloadError(f"{entry.repo}/{entry.remote} -> {entry.path}: {what}; checksum error, file removed")

    size = staged.stat().st_size
    listed_size = getattr(sibling, "size", None)
    for want, source in ((entry.size, "pinned"), (listed_size, "listed by the hub")):
        if want is not None and size != want:
            fail(f"size {size} != {source} {want}")
    digest = sha256_file(staged)
    lfs = getattr(sibling, "lfs", None)
    for want, source in ((entry.sha256, "pinned"), (getattr(lfs, "sha256", None), "the hub's LFS sha256")):
        if want and digest != want.lower():
            fail(f"sha256 {digest} != {source} {want}")
    blob = getattr(sibling, "blob_id", None)
    if lfs is None and blob and git_blob_sha1(staged) != blob:
        fail(f"git blob id {git_blob_sha1(staged)} != listed {blob}")
    return digest


def matches_listing(entry, path: Path, sibling, cache) -> bool:
    """Whether a file already on disk is the hub's at the pinned commit (size; LFS sha256 or
    git blob id; the manifest's pins): checked without downloading, then recorded as verified."""
    size = path.stat().st_size
    if any(want is not None and size != want for want in (getattr(sibling, "size", None), entry.size)):
        return False
    digest, blob = cache.digests(entry.path, path)
    lfs_sha = getattr(getattr(sibling, "lfs", None), "sha256", None)
    listed_blob = None if lfs_sha else getattr(sibling, "blob_id", None)
    if any(want and got != want.lower() for want, got in
           ((entry.sha256, digest), (lfs_sha, digest), (listed_blob, blob))):
        return False
    cache.mark_verified(entry.path, path)
    return True


def _denied(err) -> bool:
    response = getattr(err, "response", None)
    return getattr(response, "status_code", None) in (401, 403)


def fetch_repo(entries: list, out: Path) -> list[tuple[str, object]]:
    """Download the hub entries of one repo@revision into `out`; returns (status, entry) pairs.

    Status: 'present', 'downloaded' (verified against a pin) or 'unpinned' (verified against
    the hub's listing only; its size and sha256 are printed to pin)."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    first = entries[0]
    cache = HashCache(out)
    todo = [e for e in entries if not present(e, out, cache)]
    if not todo:
        return [("present", e) for e in entries]
    if first.gated and not has_token() and endpoint() == OFFICIAL_ENDPOINT:
        raise AccessDenied(gated_message(first.repo, first.page))  # before any request
    api = HfApi(endpoint=endpoint())
    staging = out / STAGING / first.repo.replace("/", "--")
    try:
        info = api.model_info(first.repo, revision=first.revision or "main", files_metadata=True)
        listed = {s.rfilename: s for s in info.siblings or []}
        absent = [e.remote for e in todo if e.remote not in listed]
        if absent:
            raise DownloadError(f"{first.repo}@{info.sha}: no such file(s) {absent}")
        if not first.revision:
            print(f"{first.repo}: revision not pinned; resolved to {info.sha}: pin `revision: {info.sha}` "
                  f"in the manifest", file=sys.stderr)
        # Files already on disk (e.g. fetched before hashes were recorded) are checked
        # against the listing instead of fetched again.
        on_disk = [e for e in todo if (out / e.path).is_file()
                   and matches_listing(e, out / e.path, listed[e.remote], cache)]
        todo = [e for e in todo if e not in on_disk]
        if not todo:
            return [("present", e) for e in entries]
        # Exact names as patterns: escape the few glob characters a file name may hold.
        snapshot_download(first.repo, revision=info.sha, local_dir=staging, endpoint=endpoint(),
                          allow_patterns=[glob.escape(e.remote) for e in todo], max_workers=4)
        results = [("present", e) for e in entries if e not in todo]
        for e in todo:
            staged = staging / e.remote
            if not staged.is_file():
                raise DownloadError(f"{first.repo}@{info.sha}: {e.remote} was not downloaded")
            digest = _check(e, staged, listed[e.remote])
            dest = out / e.path
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged, dest)  # same filesystem: atomic
            cache.mark_verified(e.path, dest)
            if e.sha256:
                results.append(("downloaded", e))
            else:
                print(f"{e.path}: not pinned; size {dest.stat().st_size}, sha256 {digest}: pin these in the "
                      f"manifest", file=sys.stderr)
                results.append(("unpinned", e))
        return results
    except GatedRepoError as err:
        raise AccessDenied(gated_message(first.repo, first.page, f", HTTP {err.response.status_code}")) from None
    except (RepositoryNotFoundError, RevisionNotFoundError) as err:
        raise DownloadError(f"{first.repo}@{first.revision}: {type(err).__name__}: {err}") from None
    except HfHubHTTPError as err:
        if _denied(err):
            raise AccessDenied(gated_message(first.repo, first.page, f", HTTP {err.response.status_code}")) from None
        raise DownloadError(f"{first.repo}@{first.revision}: {err}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if (out / STAGING).is_dir() and not any((out / STAGING).iterdir()):
            (out / STAGING).rmdir()


# ------------------------------------------------------------------ hub id -> local folder


def _model_folders(manifest=None) -> dict[str, str]:
    """repo id -> folder (relative to the reward-checkpoint dir) of the rewards' hub models."""
    folders = {}
    for e in load_manifest(manifest or MANIFEST):
        if e.group == "rewards" and e.repo and e.path != e.remote:
            folders[e.repo] = e.path[: len(e.path) - len(e.remote)].rstrip("/")
    return folders


def local_model(model: str, ckpt_dir: str | os.PathLike | None = None, manifest=None) -> str:
    """Where a scorer loads `model` from: an existing folder as given; a hub id the manifest
    lists, its downloaded folder under the reward-checkpoint dir (an error naming the download
    command when it is missing); any other id unchanged (the user's explicit choice)."""
    if Path(model).expanduser().is_dir():
        return str(Path(model).expanduser())
    repo = ALIASES.get(model, model)
    folders = _model_folders(manifest)
    if repo not in folders:
        return model
    root = resolve_ckpt_dir(str(ckpt_dir) if ckpt_dir else None)
    folder = root / folders[repo]
    if not (folder / "config.json").is_file() and not (folder / "preprocessor_config.json").is_file():
        raise FileNotFoundError(f"{model}: its local copy {folder} is missing (scorers never fetch from the hub "
                                f"at run time); download it with `{DOWNLOAD_HINT.format(dir=root)}`")
    return str(folder)


# ------------------------------------------------------------------ whole-repo snapshots
# The one hub snapshot download (LoRAs, base models of the Table 1 rows, the UnifiedReward
# judge): `marble evaluate --lora_hf_path`, the workflow's fetch rules and this CLI all call it.

TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}


def _transient(err) -> bool:
    status = getattr(getattr(err, "response", None), "status_code", None)
    return status is None or status in TRANSIENT_STATUS


# Weights a diffusers pipeline folder holds besides the ones from_pretrained reads by default
# (fp16 variants, .bin duplicates, ONNX/Flax exports): not fetched for a base model.
PIPELINE_IGNORE = ["*.fp16.*", "*.bin", "*.onnx", "*.onnx_data", "*.msgpack", "*.ckpt", "*.pb"]


def pipeline_patterns(model_index: dict) -> list[str]:
    """allow_patterns of a diffusers pipeline repo: model_index.json and the folders of the
    components it names (not the single-file checkpoints beside them: SD3.5-L's
    sd3.5_large.safetensors, FLUX.1-Dev's flux1-dev.safetensors, tens of GB unused)."""
    components = sorted(k for k, v in model_index.items()
                        if not k.startswith("_") and isinstance(v, list) and v and v[0] is not None)
    return ["model_index.json", *(f"{c}/*" for c in components)]


def pipeline_snapshot(repo_id: str, revision: str | None, out: str | os.PathLike, **kw) -> Path:
    """A diffusers pipeline repo, its components only (model_index.json decides which)."""
    import json

    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError


    try:
        index = hf_hub_download(repo_id, "model_index.json", revision=revision, token=os.environ.get("HF_TOKEN"),
                                endpoint=endpoint())
    except (HfHubHTTPError, OSError) as err:
        raise DownloadError(f"{repo_id}@{revision}: model_index.json: {err}") from None
    allow = pipeline_patterns(json.loads(Path(index).read_text(encoding="utf-8")))
    return snapshot(repo_id, revision, out, allow_patterns=allow, ignore_patterns=PIPELINE_IGNORE, **kw)


def snapshot(repo_id: str, revision: str | None, out: str | os.PathLike | None = None,
             retries: int = 3, backoff_s: float = 2.0, sleep=None, allow_patterns=None,
             ignore_patterns=None) -> Path:
    """A hub repo at `revision`, whole: into `out` (staged beside it, renamed into place, so a
    half download never looks complete), or into the huggingface_hub cache when `out` is None
    (its snapshot folder is named by the commit). Transient failures (connection, 5xx, 429)
    are retried with exponential backoff; access and not-found errors are not."""
    import time

    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )


    sleep = sleep or time.sleep
    dest = Path(out) if out is not None else None
    if dest is not None and dest.is_dir() and any(dest.iterdir()):
        return dest
    staging = dest.with_name(dest.name + ".partial") if dest is not None else None
    token = os.environ.get("HF_TOKEN")
    for attempt in range(retries + 1):
        try:
            kwargs = {"local_dir": str(staging)} if staging is not None else {}
            # endpoint read now (huggingface_hub reads HF_ENDPOINT once, at import), as fetch_repo does
            folder = Path(snapshot_download(repo_id, revision=revision, token=token, allow_patterns=allow_patterns,
                                            ignore_patterns=ignore_patterns, endpoint=endpoint(), **kwargs))
            break
        except GatedRepoError:
            raise AccessDenied(gated_message(repo_id, None)) from None
        except (RepositoryNotFoundError, RevisionNotFoundError) as err:
            raise DownloadError(f"{repo_id}@{revision}: {type(err).__name__}: {err}") from None
        except LocalEntryNotFoundError as err:  # offline (HF_HUB_OFFLINE=1) and not cached
            raise DownloadError(f"{repo_id}@{revision}: not in the local cache and offline: {err}") from None
        except (HfHubHTTPError, OSError) as err:
            if _denied(err):
                raise AccessDenied(gated_message(repo_id, None)) from None
            if attempt == retries or not _transient(err):
                raise DownloadError(f"{repo_id}@{revision}: {err} (after {attempt + 1} attempt(s))") from None
            print(f"{repo_id}@{revision}: {err}; retry {attempt + 1}/{retries}", file=sys.stderr)
            sleep(backoff_s * 2 ** attempt)
    if dest is None:
        return folder
    shutil.rmtree(staging / ".cache", ignore_errors=True)  # huggingface_hub's bookkeeping
    os.replace(staging, dest)  # same parent: atomic
    return dest


def main(argv: list[str] | None = None) -> int:
    """`python -m marble.assets.hub hf:owner/repo@commit --out DIR` (the workflow's fetch rules)."""
    import argparse


    p = argparse.ArgumentParser(prog="python -m marble.assets.hub", description=main.__doc__)
    p.add_argument("ref", help="hf:owner/repo@commit")
    p.add_argument("--out", required=True)
    p.add_argument("--pipeline", action="store_true",
                   help="a diffusers pipeline: fetch only the components model_index.json names")
    p.add_argument("--require-commit", action="store_true",
                   help="refuse a revision that is not a 40-hex commit (a branch moves)")
    args = p.parse_args(argv)
    try:
        repo, revision = parse_hub_ref(args.ref)
        if args.require_commit:
            pinned_revision(args.ref, revision)
        fetch = pipeline_snapshot if args.pipeline else snapshot
        print(fetch(repo, revision, args.out))
    except (HubRefError, ValueError, DownloadError) as exc:
        print(f"marble.assets.hub: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
