"""Hub references `[hf:]<owner>/<name>[@<revision>]`: the one parser (evaluation CLI, workflow).

Pure string handling, no network: `marble.assets.hub` downloads what these name.
"""

from __future__ import annotations

import re

HUB_PREFIX = "hf:"
COMMIT = re.compile(r"^[0-9a-f]{40}$")


class HubRefError(ValueError):
    """A string that is neither a hub reference nor what the caller accepts instead."""


def parse_hub_ref(value: str) -> tuple[str, str | None]:
    """`[hf:]<repo id>[@revision]` -> (repo id, revision or None); a clear error otherwise."""
    body = value.removeprefix(HUB_PREFIX)
    repo_id, at, revision = body.partition("@")
    parts = repo_id.split("/")
    if not repo_id or len(parts) > 2 or not all(parts) or (at and not revision):
        raise HubRefError(f"{value!r} is not a hub LoRA reference: expected "
                          f"{HUB_PREFIX}<owner>/<name>[@<revision>] or a local folder")
    return repo_id, revision or None


def is_hub_ref(value: str) -> bool:
    """Only the `hf:` spelling counts: a bare `owner/name` is a relative folder path."""
    return value.startswith(HUB_PREFIX)


def hub_ref(repo_id: str, revision: str | None) -> str:
    return f"{HUB_PREFIX}{repo_id}" + (f"@{revision}" if revision else "")


def pinned_revision(what: str, revision: str | None) -> str:
    """A revision that must be a commit (a branch moves between runs, so its results would not
    say what was evaluated): the commit, else a one-line error saying how to pin it."""
    if revision and COMMIT.match(revision):
        return revision
    raise ValueError(f"{what}: revision {revision or '(none)'!r} is not a 40-hex commit; pin one "
                     f"(the commit of the hub repo's page, `hf:owner/repo@<commit>`)")
