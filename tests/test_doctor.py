"""`marble doctor`: the tiny default passes here; the paper config fails naming each missing
piece with its fix; the SLURM settings are checked against sinfo / sacctmgr."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
import yaml

from marble import doctor
from marble.workflow import configs

ROOT = Path(__file__).resolve().parents[1]


def _root(tmp_path: Path, config: str) -> Path:
    """A workflow folder with only the config and the schema (no data/)."""
    root = tmp_path / "wf"
    (root / "workflow/schemas").mkdir(parents=True)
    shutil.copy2(ROOT / "workflow/schemas/config.schema.yaml", root / "workflow/schemas")
    shutil.copy2(ROOT / config, root / "config.yaml")
    (root / "config").mkdir()  # an overlay's base (config/paper.yaml: overlay_on config/eval.yaml)
    shutil.copy2(ROOT / "config/eval.yaml", root / "config")
    return root


def test_tiny_default_passes(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sinfo: a laptop
    root = _root(tmp_path, "config.yaml")
    assert doctor.main(["--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "0 failure(s)" in out and "reward toy_brightness" in out and "built" in out


def test_paper_config_fails_naming_each_missing_piece(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("MARBLE_UNIFIEDREWARD_URL", "http://127.0.0.1:9/v1")  # closed port
    monkeypatch.setenv("PATH", str(tmp_path))  # no sinfo here
    root = _root(tmp_path, "config/paper.yaml")
    # config/paper.yaml's judge is started by the workflow (eval.unifiedreward.server); without
    # one, the client needs a running server, which is checked (and down here).
    config = configs.load(["config.yaml"], root)
    assert config["eval"]["unifiedreward"]["server"]
    config["eval"]["unifiedreward"] = {"server": None}
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    seen: list = []
    real = doctor.run_checks

    def spy(config: dict, root: Path, downloads_pending: bool = False) -> list:
        seen.extend(real(config, root, downloads_pending))  # the real checks, recorded
        return seen

    monkeypatch.setattr(doctor, "run_checks", spy)
    assert doctor.main(["--root", str(root)]) == 1
    out = capsys.readouterr().out
    print(out)
    rows = {r.name: r for r in seen}
    for name in ["model files", "rewards files", "HF_TOKEN", "unifiedreward server"]:
        assert rows[name].status == "FAIL", (name, rows[name])
    assert "model_index.json (missing)" in rows["model files"].detail
    assert "snakemake prepare" in rows["model files"].fix and "HF_TOKEN" in rows["HF_TOKEN"].fix
    assert "sglang" in rows["unifiedreward server"].fix
    assert {"reward pickscore", "reward hpsv2", "reward ocr", "reward geneval", "ocr engine",
            "reward unifiedreward", "disk", "gpu", "torch"} <= set(rows)
    if importlib.util.find_spec("mmcv") is None:
        assert rows["mmcv-full"].status == "FAIL" and "workflow/envs/geneval.txt" in rows["mmcv-full"].fix
    if not __import__("torch").cuda.is_available():
        assert rows["gpu"].status == "warn" and "no GPU visible" in rows["gpu"].detail
    # The preflight rule runs before the downloads: missing files warn, HF_TOKEN still fails.
    pending = {r.name: r for r in doctor.asset_rows(doctor.load_workflow_config([], root), root,
                                                    downloads_pending=True)}
    assert pending["model files"].status == "warn" and pending["HF_TOKEN"].status == "FAIL"
    # The table names every failure, each with its fix on the next line.
    lines = out.splitlines()
    failed = [r.name for r in rows.values() if r.status == "FAIL"]
    assert f"{len(failed)} failure(s): {', '.join(failed)}" in out
    for i, line in enumerate(lines):
        if "  FAIL  " in line:
            assert lines[i + 1].strip().startswith("fix: "), line


def _stub(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / "bin" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(f"#!/bin/sh\n{text}\n")
    path.chmod(0o755)


def test_slurm_settings_are_checked_against_sinfo_and_sacctmgr(tmp_path, monkeypatch):
    _stub(tmp_path, "sinfo", 'case "$*" in *"-p gpu"*) echo "gpu gpu:h100:8";; *"-p cpu"*) echo "cpu (null)";; esac')
    _stub(tmp_path, "sacctmgr", "printf 'proj42\\nteam7\\n'")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    root = _root(tmp_path, "config/paper.yaml")
    (root / "site.yaml").write_text(yaml.safe_dump({"cluster": {
        "partition": "cpu", "gpu_partition": "gpu", "gpu_type": "a100", "account": "nope"}}))
    config = doctor.load_workflow_config(["config.yaml", "site.yaml"], root)
    rows = {r.name: r for r in doctor.slurm_rows(config)}
    assert rows["slurm partition"].status == "ok" and rows["slurm gpu_partition"].status == "ok"
    assert rows["slurm gres"].status == "FAIL" and "gpu:a100" in rows["slurm gres"].detail
    assert rows["slurm account"].status == "FAIL" and "proj42" in rows["slurm account"].detail
    config["cluster"].update(gpu_type="h100", account=None, gpu_partition="nogpu")
    rows = {r.name: r for r in doctor.slurm_rows(config)}
    assert rows["slurm gpu_partition"].status == "FAIL"
    assert rows["slurm account"].status == "FAIL" and "proj42, team7" in rows["slurm account"].fix


@pytest.mark.parametrize("bad, text, says", [
    ("nonexistent.yaml", None, "config file .*nonexistent.yaml does not exist"),
    ("broken.yaml", "eval: [1,\n", r"broken\.yaml line 2: not valid YAML"),
    ("list.yaml", "- 1\n", r"list\.yaml: a workflow config is a mapping")])
def test_a_missing_or_broken_config_file_is_one_line(tmp_path, bad, text, says):
    """A broken or non-mapping file was a yaml / AttributeError traceback (the doctor read files
    with its own loop; it now reads them as marble.workflow.configs does)."""
    if text is not None:
        (tmp_path / bad).write_text(text)
    with pytest.raises(SystemExit, match=f"^marble doctor: error: .*{says}"):
        doctor.load_workflow_config([bad], tmp_path)


def test_stand_in_detector_and_managed_judge_need_no_mmdet_or_running_server():
    """paper-mini's GenEval uses `detector: stub` and its judge is started per job by the
    workflow: the preflight must not demand mmdet/mmcv or a server already listening."""
    from marble.workflow import doctor_checks as checks

    assert checks.required_modules("geneval", {"detector": "stub"}) == ()
    assert "mmdet" in checks.required_modules("geneval", {})
    assert checks.managed_judge({"eval": {"unifiedreward": {"server": "sglang {port}"}}}) == "sglang {port}"
    assert checks.managed_judge({"eval": {}}) is None


def test_unpinned_hub_references_fail_the_preflight_naming_each_key():
    """The fetch refuses a hub reference without a commit, so a run would stop at its first
    download: the preflight names each one with how to pin or drop it. paper-mini drops them."""
    from marble.workflow import doctor_checks as checks

    paper = configs.load(["config/paper.yaml"], ROOT)
    unpinned = checks.unpinned_hub_references(paper)
    assert set(unpinned) == {"eval.checkpoints.flowgrpo_geneval", "eval.checkpoints.flowgrpo_ocr",
                             "eval.unifiedreward.model"}  # diffusionnft_multireward: pinned
    assert "eval.protocols.sdxl.model" in checks.hub_references(paper)  # pinned: not listed
    rows = {r.name: r for r in doctor.hub_rows(paper)}
    row = rows["hub pin eval.checkpoints.flowgrpo_ocr"]
    assert row.status == "FAIL" and "PIN-A-COMMIT" in row.detail
    assert "huggingface.co/jieliu/SD3.5M-FlowGRPO-Text HEAD" in row.fix
    assert "eval.checkpoints.flowgrpo_ocr: null" in row.fix
    bad = {"eval": {"protocols": {"sdxl": {"model": "hf:stabilityai/sdxl@main"}}}}
    assert "eval.checkpoints.sdxl: null" in doctor.hub_rows(bad)[0].fix
    mini = checks.merge(paper, yaml.safe_load((ROOT / ".test/paper-mini.yaml").read_text()))
    assert checks.unpinned_hub_references(mini) == {}
    assert [r.status for r in doctor.hub_rows(mini)] == ["ok"]
