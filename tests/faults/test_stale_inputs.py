"""Issue 49 (1): the workflow sees an input folder's content, not its date.

Every folder a rule reads (base model, reward checkpoints, raw prompts, embedding cache, a LoRA
folder named in eval.checkpoints) has one file overwritten in place, its folder's and its own
date put back, and the dry run must plan the rules that read it again: Snakemake used to date a
folder by its own timestamp only, plan nothing and leave the old score in summary.csv as
current. Dry runs only, on placeholders (no training, no evaluation)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_workflow_lib import copy_workflow, snakemake  # noqa: E402

TARGET = "results/eval/summary.csv"
# folder -> one file inside it, and the rules that must run again once that file changes
FOLDERS = {
    "data/models/tiny-sd3": ("transformer/weights.safetensors", {"train_run", "evaluate_ckpt", "embed_prompts"}),
    "data/reward_ckpts": ("head.pt", {"train_run", "evaluate_ckpt"}),
    "data/raw-tiny": ("train/prompts.jsonl", {"assemble_split"}),
    "data/datasets/tiny/embeddings": ("train.pt", {"train_run"}),
    "data/ext-lora": ("pytorch_lora_weights.safetensors", {"evaluate_ckpt"}),
}


def _project(work: Path) -> None:
    """Placeholders for every input and a finished run, all dated an hour back."""
    from marble.training.checkpoint_format import COMPLETE, marker_text

    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["runs"] = {"marble": {"preset": "tiny", "max_steps": 4}}
    cfg["dataset"]["embed"] = True
    cfg["eval"]["datasets"] = ["pickscore"]
    cfg["eval"]["checkpoints"] = {"ext": "data/ext-lora"}
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    for folder, (name, _) in FOLDERS.items():
        (work / folder / name).parent.mkdir(parents=True, exist_ok=True)
        (work / folder / name).write_bytes(b"version 1")
    (work / "data/raw-tiny/pickscore").mkdir(parents=True)
    (work / "data/raw-tiny/pickscore/test.txt").write_text("a castle at dawn\n")
    for f in ("train.parquet", "test.parquet"):
        (work / "data/datasets/tiny" / f).write_bytes(b"placeholder")
    ckpt = work / "results/runs/marble/checkpoints/checkpoint-000004"
    ckpt.mkdir(parents=True)
    (ckpt / "state.pt").write_bytes(b"placeholder")
    (ckpt / COMPLETE).write_text(marker_text(ckpt))
    (work / "results/runs/marble/train_summary.json").write_text("{}")
    old = time.time() - 3600
    for p in [*(work / "data").rglob("*"), *(work / "results").rglob("*")]:
        os.utime(p, (old, old))


def _plan(work: Path) -> tuple[set[str], list[str]]:
    out = snakemake(["-n", "-c1", TARGET], work).stdout
    rules = {line.strip().split()[1].rstrip(":") for line in out.splitlines()
             if line.strip().startswith(("rule ", "localrule ")) and line.strip().endswith(":")}
    outputs = [f.strip() for line in out.splitlines() if line.strip().startswith("output:")
               for f in line.split("output:")[1].split(",")]
    return rules, outputs


def _mark_done(work: Path, outputs: list[str]) -> None:
    """The planned jobs as done, in plan order: each output newer than what it reads, all
    older than the next digest a change writes (nothing dated a second ahead)."""
    for n, out in enumerate(outputs):
        path = work / out
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("{}")
        stamp = time.time() + n * 1e-3
        os.utime(path, (stamp, stamp))


def _overwrite_in_place(path: Path) -> None:
    """Same size, and the file's and folders' dates put back: only the content tells."""
    dates = {p: p.stat() for p in [path, *path.parents]}
    path.write_bytes(b"version 2")
    for p, st in dates.items():
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.fault("input folder's content changed in place (model, reward ckpts, raw, embeddings, LoRA)")
def test_a_changed_file_in_any_input_folder_replans_its_dependants(tmp_path, monkeypatch, fault_trials):
    monkeypatch.setenv("MARBLE_HASH_CACHE", str(tmp_path / "hashes.json"))  # kept across the reads
    work = copy_workflow(tmp_path / "repo")
    _project(work)
    rules, outputs = _plan(work)
    assert "evaluate_ckpt" in rules and "train_run" not in rules, rules  # first sight replans nothing
    _mark_done(work, outputs)
    assert _plan(work)[0] == set()
    for folder, (name, expected) in FOLDERS.items():
        _overwrite_in_place(work / folder / name)
        rules, outputs = _plan(work)
        fault_trials.record(expected <= rules, f"{folder}/{name} rewritten: planned {sorted(rules)}")
        _mark_done(work, outputs)
    assert _plan(work)[0] == set()  # each change reran once, nothing reruns twice
    assert not fault_trials.lost, fault_trials.lost
