"""Your own prompts and your own reward (README, "Your own prompts and reward"; issue 51): a
prompt set and a reward written outside the repository, named in one config file, trained,
evaluated and reported by `snakemake -c2 all --configfile`, with no edit inside the package."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import yaml
from test_workflow_lib import copy_workflow, env, snakemake

from marble.rewards import user

ROOT = Path(__file__).resolve().parents[1]

REWARD = textwrap.dedent('''
    from marble.rewards import Reward


    class Sharpness(Reward):
        """Mean absolute horizontal pixel difference: crisp edges score high."""

        name = "sharpness"

        def score(self, images, prompts, metadata):
            return (images[..., 1:] - images[..., :-1]).abs().flatten(1).mean(dim=1)
''')
TRAIN = ["a red apple on a table", "a blue car in the rain", "a green field at dawn", "a white cat asleep",
         "a yellow boat on a lake", "a black dog running"]
TEST = ["a red door", "a blue sea", "an orange sunset"]
ENTRY = {"name": "sharpness", "target": "my_rewards.py:Sharpness", "flops": 4.0e5}


def _user_folder(folder: Path) -> Path:
    """What a user writes: the reward's file, prompt text files in the raw layout, one config."""
    folder.mkdir(parents=True)
    (folder / "my_rewards.py").write_text(REWARD)
    (folder / "prompts" / "pickscore").mkdir(parents=True)
    # training prompts as a table: sharpness is not asked of the first two (a per-reward column)
    rows = [{"prompt": p, "sharpness": i >= 2} for i, p in enumerate(TRAIN)]
    (folder / "prompts/pickscore/train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "prompts/pickscore/test.txt").write_text("\n".join(TEST) + "\n")  # one prompt a line
    config = {
        "mode": "tiny", "raw_dir": str(folder / "prompts"),
        "dataset": {"name": "mine", "preset": "tiny", "rewards": ["toy_brightness", "sharpness"]},
        "rewards": [{**ENTRY, "target": str(folder / "my_rewards.py") + ":Sharpness"}],
        "pretrain": {"vae_steps": 2, "flow_steps": 2, "seed": 0},
        "runs": {"mine": {"preset": "tiny", "max_steps": 1, "set": [
            "rewards=[{name: toy_brightness}, {name: sharpness}]", "sampling.num_batches_per_epoch=1",
            "sampling.num_steps=2", "train.save_every=1"]}},
        "train": {"nodes": 1, "cpus_per_task": 2, "mem_mb": 4000, "runtime": 20},
        "eval": {"datasets": ["pickscore"], "limit": 2, "num_inference_steps": 2, "resolution": 32,
                 "rewards": {"pickscore": ["toy_brightness", "sharpness"]},
                 "resources": {"cpus_per_task": 1, "mem_mb": 3000, "runtime": 20}},
        "bench": {"preset": "tiny", "repeats": 1},
    }
    (folder / "mine.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return folder / "mine.yaml"


def test_a_config_names_a_reward_every_process_registers(tmp_path, monkeypatch):
    """MARBLE_REWARDS (what the Snakefile exports) registers the reward in a fresh process."""
    (tmp_path / "my_rewards.py").write_text(REWARD)
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump({"rewards": [ENTRY]}))
    code = ("from marble import rewards; from marble.workflow import flops; "
            "print(rewards.build('sharpness').name, flops.scorer_flops('sharpness'))")
    out = subprocess.run([sys.executable, "-c", code], env={**env(), user.ENV: str(tmp_path / "mine.yaml")},
                         capture_output=True, text=True, cwd=tmp_path.parent, check=True).stdout
    assert out.split() == ["sharpness", "400000.0"]


@pytest.mark.parametrize("entry, named", [
    ({"name": "s", "target": "m.py:S"}, r"rewards\[0\] \(s\)\.flops"),
    ({"name": "s", "target": "m.py:S", "flops": 1, "cost": 2}, r"rewards\[0\]\.cost: unknown key"),
    ({"name": "s", "target": "no_colon", "flops": 1}, r"rewards\[0\] \(s\)\.target"),
])
def test_a_bad_entry_is_one_line_naming_its_key(entry, named, tmp_path):
    with pytest.raises(user.UserRewardError, match=named):
        user.descriptors_of([entry], tmp_path)


def test_a_prompt_table_says_where_each_reward_applies(tmp_path):
    """JSONL or CSV with a `prompt` column and per-reward columns: a stated cell beats the rule
    (toy_text_contrast's rule wants a quoted span), an empty one keeps it."""
    from marble.data.assemble import assemble_split
    from marble.rewards import build_masks
    from marble.config import RewardSpec

    (tmp_path / "ocr").mkdir()
    (tmp_path / "ocr/train.csv").write_text('prompt,toy_text_contrast\na sign saying "hi",false\n'
                                            'a sign saying "yo",\nplain words,true\n')
    masks = build_masks([RewardSpec(name="toy_text_contrast"), RewardSpec(name="toy_brightness")])
    table = assemble_split(tmp_path, "train", masks).table
    assert table["applies__toy_text_contrast"].tolist() == [False, True, True]
    assert table["applies__toy_brightness"].tolist() == [True, True, True]
    (tmp_path / "ocr/train.csv").unlink()
    # blank lines (an editor's trailing newlines) hold no prompt; the lines keep their numbers
    (tmp_path / "ocr/train.jsonl").write_text('{"prompt": "a"}\n\n{"prompt": "b", "toy_text_contrast": false}\n\n')
    table = assemble_split(tmp_path, "train", masks).table
    assert table["prompt"].tolist() == ["a", "b"]
    (tmp_path / "ocr/train.jsonl").write_text('{"prompt": "a", "toy_brightnes": true}\n')
    with pytest.raises(ValueError, match=r"ocr/train.jsonl:1: column 'toy_brightnes' is not a reward"):
        assemble_split(tmp_path, "train", masks)


def test_the_doctor_names_the_reward_whose_module_is_missing(tmp_path, monkeypatch, capsys):
    from marble import doctor, rewards

    (tmp_path / "my_rewards.py").write_text(REWARD)
    root = copy_workflow(tmp_path / "wf", config=None)
    config = yaml.safe_load((root / "config.yaml").read_text())
    config["rewards"] = [{**ENTRY, "target": str(tmp_path / "my_rewards.py") + ":Sharpness",
                          "modules": ["no_such_module_x"]}]
    config["runs"] = {"mine": {"preset": "tiny", "set": ["rewards=[{name: toy_brightness}, {name: sharpness}]"]}}
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.setenv("PATH", str(tmp_path))  # no sinfo: a laptop
    monkeypatch.setenv(user.ENV, "")  # the doctor sets it for its children: undone after the test
    try:
        assert doctor.main(["--root", str(root)]) == 1
    finally:
        rewards.unregister("sharpness")
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("reward sharpness")]
    assert len(rows) == 1 and "missing module(s) no_such_module_x" in rows[0], rows


def test_own_prompts_and_reward_through_snakemake(tmp_path):
    """The Done-when of issue 51: prompts and reward outside the repository, one config file,
    `snakemake -c2 all --configfile` to a report whose tables have the user's reward."""
    mine = _user_folder(tmp_path / "user")
    repo = copy_workflow(tmp_path / "repo", config=None)
    snakemake(["-c2", "all", "--configfile", str(mine)], repo, timeout=600)
    table = pd.read_parquet(repo / "data/datasets/mine/train.parquet")
    assert dict(zip(table["prompt"], table["applies__sharpness"])) == {p: i >= 2 for i, p in enumerate(TRAIN)}
    train = [json.loads(line) for line in (repo / "results/runs/mine/metrics.jsonl").read_text().splitlines()]
    assert any("sharpness" in key for key in train[-1]), sorted(train[-1])
    with open(repo / "results/eval/summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert any(row["metric"] == "sharpness" and float(row["value"]) > 0 for row in rows), rows
    assert "sharpness" in (repo / "results/eval/table.md").read_text()
    assert "sharpness" in (repo / "results/report/report.md").read_text()
    # later, by hand, without MARBLE_REWARDS: the run folder recorded its own rewards
    hand = {k: v for k, v in env().items() if k != user.ENV}
    proc = subprocess.run([sys.executable, "-m", "marble.evaluate", "--checkpoint_path", "results/runs/mine",
                           "--dataset", "pickscore", "--output_dir", "by_hand", "--limit", "1"],
                          cwd=repo, env=hand, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["sharpness"] > 0


def test_the_readme_section_runs_as_written(tmp_path):
    """README's "Your own prompts and reward" (<= 200 words): its reward file and config, with
    /home/me/mine made a temporary folder, plan a whole run (a dry run of `all`)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## Your own prompts and reward\n(.*?)(?=^## )", text, re.S | re.M).group(1)
    assert len(section.split()) <= 200 and len(text.split()) <= 1500
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    config = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    mine = tmp_path / "mine"
    (mine / "prompts/pickscore").mkdir(parents=True)
    (mine / "my_rewards.py").write_text(code)
    for split in ("train", "test"):
        (mine / f"prompts/pickscore/{split}.txt").write_text("a red apple\na blue car\n")
    (mine / "mine.yaml").write_text(config.replace("/home/me/mine", str(mine)))
    repo = copy_workflow(tmp_path / "repo", config=None)
    proc = snakemake(["-n", "all", "--configfile", str(mine / "mine.yaml")], repo)
    assert "train_run" in proc.stdout and [d.name for d in user.from_env(str(mine / "mine.yaml"))] == ["sharpness"]


def test_a_column_puts_it_in_table_1s_metrics(tmp_path):
    """With `column:` the reward is one of Table 1's columns (label, place, scale), in every process."""
    (tmp_path / "my_rewards.py").write_text(REWARD)
    entry = {**ENTRY, "column": {"label": "Sharp", "position": 9, "scale": 10.0, "datasets": ["pickscore"]}}
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump({"rewards": [entry]}))
    code = "from marble.evaluation.summary import PAPER_METRICS; print(PAPER_METRICS[-1])"
    out = subprocess.run([sys.executable, "-c", code], env={**env(), user.ENV: str(tmp_path / "mine.yaml")},
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "('Sharp', ('sharpness',), ('pickscore',), 10.0, 3)"
