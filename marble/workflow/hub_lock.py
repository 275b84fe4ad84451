"""The hub revision lock: a commit for every `hf:repo@PIN-A-COMMIT` reference, learnt once.

    marble hub lock [--configfile config/paper.yaml ...] [--out config/hub.lock]
    (marble.workflow.hub_cli)

Run once on a machine that reaches the hub: resolves each reference the config leaves at
`PIN-A-COMMIT` to the commit its `main` names now (huggingface_hub's model_info, so
HF_ENDPOINT and HF_TOKEN apply), writes the lock file (YAML, atomic; commit it to git or
track it with DVC) and prints what it resolved. A config names its lock with `hub_lock:`
(config/eval.yaml: config/hub.lock); marble.workflow.configs applies it when composing, so
the fetch rules, `marble doctor` and evaluation see the locked commit, and a reference that
is neither pinned nor locked still reaches the fetch as PIN-A-COMMIT, which it refuses
(`--require-commit`). A lock records when it was made: "main" today may be a later upload
than the one the paper evaluated (POSTDATES lists the repos known to have moved).
"""

from __future__ import annotations

import datetime
from pathlib import Path

import yaml

from marble.config_parse import load_yaml
from marble.assets.hub_ref import is_hub_ref, parse_hub_ref
from marble.runtime.io import write_text
from marble.workflow.evaluation import JUDGE

LOCK_KEY = "hub_lock"
PLACEHOLDER = "PIN-A-COMMIT"
# Repos whose "main" is known to have changed after the paper's evaluation (issue 29).
POSTDATES = {
    "jieliu/SD3.5M-FlowGRPO-GenEval": "its model card announces a new GenEval model released on the same repo",
    "CodeGoat24/UnifiedReward-7b-v1.5": "its weights were re-uploaded after the first release",
}


def _eval_refs(config: dict) -> list[tuple[dict, str]]:
    """(mapping, key) of every place evaluation reads a hub reference from."""
    ev = config.get("eval") or {}
    places = [(ev["checkpoints"], row) for row in (ev.get("checkpoints") or {})]
    places += [(spec, "model") for spec in (ev.get("protocols") or {}).values() if isinstance(spec, dict)]
    if isinstance(ev.get(JUDGE), dict):
        places.append((ev[JUDGE], "model"))
    return [(m, k) for m, k in places if isinstance(m.get(k), str) and is_hub_ref(m[k])]


def placeholders(config: dict) -> list[str]:
    """The repos whose reference is still `@PIN-A-COMMIT`, in config order."""
    repos = [parse_hub_ref(m[k]) for m, k in _eval_refs(config)]
    return list(dict.fromkeys(repo for repo, rev in repos if rev == PLACEHOLDER))


def read_lock(path: Path) -> dict[str, dict]:
    """{repo: {commit, resolved_at}}; {} when there is no lock file; a bad one is one line."""
    path = Path(path)
    if not path.is_file():
        return {}
    try:
        data = load_yaml(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError:  # one line naming the file, as for a well-formed but wrong lock
        data = None
    repos = data.get("repos") if isinstance(data, dict) else None
    if not isinstance(repos, dict) or not all(
            isinstance(v, dict) and len(str(v.get("commit", ""))) == 40 for v in repos.values()):
        raise SystemExit(f"error: {path}: a hub lock is `repos: {{<owner/repo>: {{commit: <40 hex>}}}}`")
    return repos


def apply_lock(config: dict, lock: dict[str, dict]) -> list[str]:
    """Replace `@PIN-A-COMMIT` by the locked commit in place; returns the repos it locked.
    A reference that names a revision keeps it: the config's own pin wins over the lock."""
    applied = []
    for mapping, key in _eval_refs(config):
        repo, revision = parse_hub_ref(mapping[key])
        if revision == PLACEHOLDER and repo in lock:
            mapping[key] = f"hf:{repo}@{lock[repo]['commit']}"
            applied.append(repo)
    return applied


def resolve(repos: list[str]) -> dict[str, str]:
    """{repo: the commit its main names now}, asked of the hub (HF_ENDPOINT, HF_TOKEN)."""
    from huggingface_hub import HfApi  # deferred: the DAG build never needs it

    api = HfApi()
    return {repo: api.model_info(repo, revision="main").sha for repo in repos}


def lock(config: dict, out: Path, now: datetime.datetime | None = None) -> dict[str, dict]:
    """Resolve the config's placeholders, merge them into the lock at `out`, write it."""
    repos = placeholders(config)
    stamp = (now or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
    found = {repo: {"commit": sha, "resolved_at": stamp} for repo, sha in resolve(repos).items()}
    merged = read_lock(out) | found
    header = ("# marble hub lock: the commit each PIN-A-COMMIT reference's main named when locked\n"
              "# (python -m marble.workflow.hub_lock). Commit this file; rerun to relock.\n")
    write_text(out, header + yaml.safe_dump({"repos": merged}, sort_keys=True))
    return found


def postdate_notes(config: dict) -> dict[str, str]:
    """{repo: note} for the referenced repos in POSTDATES: the commit used (pinned, or locked
    by this command, i.e. main on the day it ran) may be later than the one the paper evaluated."""
    notes = {}
    for mapping, key in _eval_refs(config):
        repo, revision = parse_hub_ref(mapping[key])
        if repo in POSTDATES:
            notes[repo] = (f"{repo}@{revision}: a locked commit is main on the day `marble hub lock` "
                           f"ran, which may postdate the paper ({POSTDATES[repo]})")
    return notes
