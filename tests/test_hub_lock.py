"""The hub revision lock (issue 29 item 4): `marble hub lock` against the loopback hub mirror
resolves config/paper.yaml's three PIN-A-COMMIT references, and the fetch evaluation runs
takes the locked commit; a reference neither pinned nor locked is still refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from test_workflow_lib import ROOT

from marble import doctor
from beds.mirror_server import MirrorServer
from marble.workflow import configs, doctor_checks, hub_lock

PLACEHOLDER_REPOS = {"jieliu/SD3.5M-FlowGRPO-GenEval": "1" * 40, "jieliu/SD3.5M-FlowGRPO-Text": "2" * 40,
                     "CodeGoat24/UnifiedReward-7b-v1.5": "3" * 40}


def _mirror(root):
    """A hub mirror serving the three repos at made-up commits (their `main`)."""
    for repo in PLACEHOLDER_REPOS:
        (root / "hub" / repo).mkdir(parents=True)
        (root / "hub" / repo / "adapter_config.json").write_text(json.dumps({"r": 4, "repo": repo}))
    (root / "mirror.json").write_text(json.dumps(
        {"repos": {repo: {"revision": sha, "gated": False} for repo, sha in PLACEHOLDER_REPOS.items()}}))
    return root


def _run(args, cwd, endpoint):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(cwd / "hf-home"), PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True)


def test_lock_resolves_the_placeholders_and_the_fetch_honours_it(tmp_path):
    work = tmp_path / "wf"
    shutil.copytree(ROOT / "config", work / "config")
    (work / "config/hub.lock").unlink(missing_ok=True)
    before = configs.load(["config/paper.yaml"], work)
    assert set(hub_lock.placeholders(before)) == set(PLACEHOLDER_REPOS)
    with MirrorServer(_mirror(tmp_path / "mirror"), idle_s=60) as server:
        out = _run(["marble.workflow.hub_cli", "lock", "--configfile", "config/paper.yaml"], work, server.url)
        assert out.returncode == 0, out.stderr
        for repo, sha in PLACEHOLDER_REPOS.items():
            assert f"{repo}: {sha}" in out.stdout
        assert "wrote config/hub.lock (3 locked)" in out.stdout
        locked = configs.load(["config/paper.yaml"], work)
        assert doctor_checks.unpinned_hub_references(locked) == {}
        ref = locked["eval"]["checkpoints"]["flowgrpo_ocr"]
        assert ref == f"hf:jieliu/SD3.5M-FlowGRPO-Text@{'2' * 40}"
        # The pinned rows keep their own commits (the lock fills placeholders only).
        pinned = "flowgrpo_pickscore"
        assert locked["eval"]["checkpoints"][pinned] == before["eval"]["checkpoints"][pinned]
        # The fetch rule's command with the locked reference downloads; the placeholder is refused.
        got = _run(["marble.assets.hub", ref, "--out", str(tmp_path / "lora"), "--require-commit"], work, server.url)
        assert got.returncode == 0, got.stderr
        assert json.loads((tmp_path / "lora/adapter_config.json").read_text())["repo"] == "jieliu/SD3.5M-FlowGRPO-Text"
        refused = _run(["marble.assets.hub", "hf:jieliu/SD3.5M-FlowGRPO-Text@PIN-A-COMMIT", "--out",
                        str(tmp_path / "no"), "--require-commit"], work, server.url)
        assert refused.returncode == 2 and not (tmp_path / "no").exists()
    # The doctor warns that the locked GenEval and UnifiedReward commits may postdate the paper.
    rows = {r.name: r for r in doctor.hub_rows(locked)}
    for repo in ("jieliu/SD3.5M-FlowGRPO-GenEval", "CodeGoat24/UnifiedReward-7b-v1.5"):
        assert rows[f"hub revision {repo}"].status == doctor.WARN
        assert "may postdate the paper" in rows[f"hub revision {repo}"].detail
    assert "hub revision jieliu/SD3.5M-FlowGRPO-Text" not in rows
    assert rows["hub pins"].status == doctor.OK


def test_a_bad_lock_file_is_one_line(tmp_path):
    (tmp_path / "hub.lock").write_text("repos: {a/b: {commit: main}}\n")
    with pytest.raises(SystemExit, match="hub.lock: a hub lock is"):
        hub_lock.read_lock(tmp_path / "hub.lock")
    config = {"eval": {"checkpoints": {"x": "hf:a/b@PIN-A-COMMIT", "y": "hf:a/b@" + "4" * 40}}}
    assert hub_lock.apply_lock(config, {"a/b": {"commit": "5" * 40}}) == ["a/b"]
    assert config["eval"]["checkpoints"] == {"x": "hf:a/b@" + "5" * 40, "y": "hf:a/b@" + "4" * 40}


def test_broken_yaml_is_one_line_naming_the_file(tmp_path):
    """A lock or an overlay's base that is not YAML at all: one line naming the file (it was a
    yaml.ScannerError traceback from marble hub lock, marble doctor and the DAG build)."""
    (tmp_path / "hub.lock").write_text("repos: {a/b: {commit: [1\n")
    with pytest.raises(SystemExit, match="hub.lock: a hub lock is"):
        hub_lock.read_lock(tmp_path / "hub.lock")
    (tmp_path / "base.yaml").write_text("eval: [1,\n")
    with pytest.raises(SystemExit, match=r"base\.yaml line 2: not valid YAML"):
        configs.compose({"overlay_on": "base.yaml"}, tmp_path)


def test_the_lock_is_all_or_nothing(tmp_path, monkeypatch, capsys):
    """One repo the hub does not answer: no commit is written (the lock keeps what it held) and
    the command says why in one line; the hub's API is a stand-in with its real signature."""
    import types

    from huggingface_hub import HfApi

    from marble.workflow import hub_cli

    down = {"o/b"}

    def model_info(self, repo_id, *, revision=None, timeout=None, securityStatus=None, files_metadata=False,
                   expand=None, token=None):
        if repo_id in down:
            raise OSError(f"{repo_id}: 404 Not Found")
        return types.SimpleNamespace(sha="6" * 40)

    monkeypatch.setattr(HfApi, "model_info", model_info)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text("hub_lock: hub.lock\neval: {checkpoints: {a: hf:o/a@PIN-A-COMMIT, "
                                     "b: hf:o/b@PIN-A-COMMIT}}\n")
    before = "repos:\n  o/z: {commit: " + "7" * 40 + "}\n"
    (tmp_path / "hub.lock").write_text(before)
    assert hub_cli.main(["lock", "--configfile", "c.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "o/b: 404 Not Found" in err
    assert (tmp_path / "hub.lock").read_text() == before
    down.clear()  # the hub answers again: both locked, the earlier entry kept
    assert hub_cli.main(["lock", "--configfile", "c.yaml"]) == 0
    assert set(hub_lock.read_lock(tmp_path / "hub.lock")) == {"o/a", "o/b", "o/z"}
