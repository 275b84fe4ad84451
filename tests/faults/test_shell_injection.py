"""Fault: config values that are shell code, or paths with spaces (issue 21, item 1).

Every path key of the tiny workflow holds spaces and shell metacharacters. The dry run
with `-p` prints every job's command: each must keep the value as one shell word, and
one real run of two cheap rules (the tiny prompts, the reward folder) must make its outputs
at those paths with nothing executed (no PWNED file).
Before the fix `reward_ckpt_dir: "x;touch PWNED;exit 0;#"` created the file, and a space
made bash run the rest of the path (rc 127) in every train and eval job.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from marble.training.checkpoint_format import COMPLETE, marker_text

pytestmark = pytest.mark.fault("shell injection / spaces in every path key")

# Quotes of both kinds, $( ), backticks, ;, &, #, a glob and spaces; no control characters
# (the schema refuses those, see test_schema_refuses_unsafe_paths).
NASTY = "d/x y;touch PWNED1;#'q\"$(touch PWNED2)`touch PWNED3`&*"


def _config(repo: Path) -> dict:
    """The CI config with every path key under NASTY, and the folders it names."""
    from test_workflow_lib import copy_workflow

    copy_workflow(repo)
    cfg = yaml.safe_load((repo / "config.yaml").read_text())
    cfg.update(model_dir=f"{NASTY}/model", reward_ckpt_dir=f"{NASTY}/reward ckpts",
               raw_dir=f"{NASTY}/raw")
    scanned = repo / NASTY / "scan" / "old" / "checkpoints" / "checkpoint-000002"
    scanned.mkdir(parents=True)
    (scanned / "state.pt").write_bytes(b"x")
    (scanned / COMPLETE).write_text(marker_text(scanned))
    lora = repo / NASTY / "ext lora"
    lora.mkdir(parents=True)
    (lora / "pytorch_lora_weights.safetensors").write_bytes(b"x")
    (repo / NASTY / "published.yaml").write_text("rows: []\n")
    cfg["eval"].update(scan_dirs=[f"{NASTY}/scan"], checkpoints={"ext": f"{NASTY}/ext lora"},
                       published=f"{NASTY}/published.yaml")
    (repo / "config.yaml").write_text(yaml.safe_dump(cfg))
    return cfg


def _shell_commands(stdout: str) -> list[str]:
    return [line.split("Shell command: ", 1)[1] for line in stdout.splitlines()
            if line.startswith("Shell command: ") and not line.endswith("None")]


def _pwned(repo: Path) -> list[Path]:
    return sorted(repo.rglob("PWNED*")) + sorted(Path.cwd().glob("PWNED*"))


def test_every_path_key_stays_one_shell_word_and_nothing_executes(tmp_path):
    from test_workflow_lib import snakemake

    repo = tmp_path / "repo"
    _config(repo)
    proc = snakemake(["-n", "-p", "all", "results/eval/paper_comparison.md"], repo)
    commands = _shell_commands(proc.stdout)
    rules = {line.split()[1].rstrip(":") for line in proc.stdout.splitlines()
             if line.startswith(("rule ", "localrule "))}
    assert {"train_run", "evaluate_ckpt", "bench_step", "paper_comparison",
            "pretrain_tiny_model", "assemble_split", "make_tiny_prompts"} <= rules
    seen = 0
    for cmd in commands:
        for word in shlex.split(cmd):
            if "PWNED" in word:  # any piece of a value must come with the whole value
                assert NASTY in word, f"split or unquoted value in: {cmd}"
                seen += 1
    # model, raw, rewards in train and eval, scanned and named checkpoints, published
    assert seen >= 12, commands
    assert any(f"MARBLE_REWARD_CKPTS={NASTY}/reward ckpts" in shlex.split(c) for c in commands)
    assert any(f"{NASTY}/ext lora" in shlex.split(c) for c in commands)
    assert any(f"{NASTY}/scan/old/checkpoints/checkpoint-000002" in shlex.split(c)
               for c in commands)
    # The real thing: two cheap rules run through bash at those paths.
    snakemake(["-c1", f"{NASTY}/reward ckpts", f"{NASTY}/raw"], repo)
    assert (repo / NASTY / "reward ckpts" / "README.txt").is_file()
    assert any((repo / NASTY / "raw").iterdir())
    assert _pwned(repo) == []


@pytest.mark.parametrize("value", ["data/a\nb", "data/tab\there", "-rf", "data/{run}", ""])
def test_schema_refuses_unsafe_paths(value):
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate
    from test_workflow_lib import ROOT

    schema = str(ROOT / "workflow" / "schemas" / "config.schema.yaml")
    for key in ("model_dir", "reward_ckpt_dir", "raw_dir"):
        with pytest.raises(WorkflowError):
            validate({key: value}, schema)
    with pytest.raises(WorkflowError):
        validate({"eval": {"scan_dirs": [value]}}, schema)
    validate({"model_dir": NASTY, "eval": {"scan_dirs": [NASTY]}}, schema)  # spaces, quotes: fine
