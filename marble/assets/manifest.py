"""The download manifest: what marble fetches, where it lands, and how a file is checked.

`manifest.yaml` (beside this module; `--manifest` / $MARBLE_MANIFEST for another) lists every
input by group (`model`, `rewards`, `datasets`): plain-URL `files` and pinned hub `hub` repos,
each file with its `size` and `sha256` where pinned. `load_manifest` validates it (unknown or
missing keys are an error naming the file and the entry) into `Entry`s; the fetchers are
`marble.assets.download` (plain URLs, the CLI) and `marble.assets.hub` (hub snapshots).

The reward checkpoints land in one folder, `ckpt_dir()`, which the scorers read at run time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from marble.assets.verify import HashCache, problem
from marble.config_parse import load_yaml

MANIFEST = Path(__file__).with_name("manifest.yaml")
GROUPS = ("model", "rewards", "datasets")
GROUP_KEYS = {"dir", "files", "hub"}
FILE_KEYS = {"path", "url", "size", "sha256", "git_blob", "sha256_prefix", "unpinned_reason", "auth",
             "page"}
HUB_KEYS = {"repo", "revision", "gated", "page", "into", "files"}
HUB_FILE_KEYS = {"path", "size", "sha256"}


class DownloadError(RuntimeError):
    """A file could not be fetched or verified; the message names it."""


class AccessDenied(DownloadError):
    """HTTP 401/403 (a gated model without an accepted licence or a valid HF_TOKEN)."""


@dataclass(frozen=True)
class Entry:
    group: str
    path: str  # relative to the group's folder
    url: str | None
    size: int | None
    sha256: str | None
    auth: str | None = None  # "hf": send HF_TOKEN (plain URLs on the hub)
    page: str | None = None  # licence page of a gated model
    repo: str | None = None  # hub entries: repo id, commit, path inside the repo
    revision: str | None = None
    remote: str | None = None
    gated: bool = False
    git_blob: str | None = None  # the file's git blob id in the pinned commit (pins size too)
    sha256_prefix: str | None = None  # all that is published for some checkpoints (openmmlab's)
    # Why no digest is recorded yet (a file no one could hash here): said, never silent; the
    # download prints the sha256 it got, to be recorded here.
    unpinned_reason: str | None = None

    @property
    def pinned(self) -> bool:
        """Whether the manifest pins the content (a hub file is also pinned by its commit's listing)."""
        return bool(self.sha256 or self.git_blob or (self.repo and self.revision))


def _keys(where: str, spec: dict, allowed: set[str], required: tuple[str, ...]) -> None:
    if not isinstance(spec, dict):
        raise DownloadError(f"{where}: expected a mapping, got {spec!r}")
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise DownloadError(f"{where}: unknown key(s) {unknown} (allowed: {sorted(allowed)})")
    missing = [k for k in required if not spec.get(k)]
    if missing:
        raise DownloadError(f"{where} lacks {missing}")


def _hub_entries(path: Path, group: str, i: int, spec: dict) -> list[Entry]:
    where = f"{path}: groups.{group}.hub[{i}]"
    _keys(where, spec, HUB_KEYS, ("repo", "files"))
    into = str(spec.get("into") or ".").strip("/")
    out = []
    for j, f in enumerate(spec["files"]):
        _keys(f"{where}.files[{j}]", f, HUB_FILE_KEYS, ("path",))
        local = f["path"] if into == "." else f"{into}/{f['path']}"
        out.append(Entry(group, local, None, f.get("size"), f.get("sha256"), page=spec.get("page"),
                         repo=spec["repo"], revision=spec.get("revision"), remote=f["path"],
                         gated=bool(spec.get("gated"))))
    return out


def load_manifest(path: str | Path | None = None) -> list[Entry]:
    """The entries of `path`, else of $MARBLE_MANIFEST, else of the packaged manifest: the one
    `marble download` uses, so the doctor's verification and disk estimate count the same files."""
    path = Path(path or os.environ.get("MARBLE_MANIFEST") or MANIFEST)
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DownloadError(f"manifest {path} does not exist") from None
    entries = []
    for group, spec in (data or {}).get("groups", {}).items():
        _keys(f"{path}: groups.{group}", spec, GROUP_KEYS, ())
        for i, f in enumerate(spec.get("files") or []):
            _keys(f"{path}: groups.{group}.files[{i}]", f, FILE_KEYS, ("path", "url"))
            entries.append(Entry(group, f["path"], f["url"], f.get("size"), f.get("sha256"),
                                 f.get("auth"), f.get("page"), git_blob=f.get("git_blob"),
                                 sha256_prefix=f.get("sha256_prefix"),
                                 unpinned_reason=f.get("unpinned_reason")))
        for i, hub in enumerate(spec.get("hub") or []):
            entries.extend(_hub_entries(path, group, i, hub))
    return entries


def group_dirs(path: str | Path = MANIFEST) -> dict[str, str]:
    """group -> its folder under `--root` (for `marble download all`)."""
    data = load_yaml(Path(path).read_text(encoding="utf-8")) or {}
    return {g: spec.get("dir") or g for g, spec in data.get("groups", {}).items()}


def present(entry: Entry, out: Path, cache: HashCache | None = None) -> bool:
    """out/entry.path exists and its content matches its pin (re-hashed unless cached)."""
    return problem(entry, out, cache) is None


def missing_files(entries: list[Entry], out: Path) -> list[str]:
    """Entries absent on disk or whose content does not match its pin, each with the reason."""
    cache = HashCache(out)
    return [f"{out / e.path} ({why})" for e in entries if (why := problem(e, out, cache))]


# ------------------------------------------------------------------ where reward checkpoints live

DEFAULT_CKPT_DIR = "data/reward_ckpts"
DOWNLOAD_HINT = "marble download rewards --out {dir}"


def ckpt_dir(option: str | None) -> Path:
    """The reward-checkpoint folder: the option, else $MARBLE_REWARD_CKPTS, else data/reward_ckpts."""
    return Path(option or os.environ.get("MARBLE_REWARD_CKPTS") or DEFAULT_CKPT_DIR)
