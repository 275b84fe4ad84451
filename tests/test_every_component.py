"""One run over every registered component (issue 50 item 3), as one list of short runs: each
balancer the registry holds trains one tiny step on every reward that runs without a
checkpoint or a judge, the pipeline's report is built over those runs, and every registered
reward (the paper's on their tiny replicas, tests/beds) scores a batch through the one scorer
builder that training and evaluation share. Nothing here names a balancer or a reward: a new
one is picked up from its descriptor, and one that breaks a stage fails here.

Cost (2 cores): one tiny model, 1 step per balancer at 32 px and 2 sampling steps, one report.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from extras import needs

from marble.balance import METHODS
from marble.config import RewardSpec
from marble.config_balancers import balancer_descriptor
from marble.data.records import PromptRecord, to_frame
from marble.rewards import build, build_scorers, descriptors

# Rewards a laptop trains with as they are: no checkpoint to write (`replica`), no served judge.
OFFLINE = [d.name for d in descriptors() if d.replica is None and not d.judge]
PROMPTS = [
    PromptRecord.make("a photo of a red apple", "geneval",
                      {"tag": "color_attr", "include": [{"class": "apple", "count": 1, "color": "red"}]}),
    PromptRecord.make('a sign that says "hello"', "ocr"),
    PromptRecord.make("a castle at dawn", "pickscore"),
]


def _table(path):
    """The three prompts with each offline reward's own mask (its `applies`, as assembly does)."""
    rewards = {name: build(name) for name in OFFLINE}
    masks = {name: [r.applies(p.prompt, {**p.metadata, "source": p.source}) for p in PROMPTS]
             for name, r in rewards.items()}
    to_frame(PROMPTS, masks).to_parquet(path)
    return path


def _zoo(method: str) -> list[str]:
    """A zoo method names its torchjd weighting (tests/extras.py: skipped, or failed in CI)."""
    if balancer_descriptor(method).cadence != "zoo":
        return []
    needs("torchjd.aggregation", "zoo")
    return ["balancer.weighting=mgda"]


@pytest.fixture(scope="module")
def runs_dir(tiny_model_dir, tmp_path_factory):
    return tmp_path_factory.mktemp("every_component")


def _train(method: str, model, runs_dir):
    """One tiny step of `method` on every offline reward, once per module (the report reuses it)."""
    from marble.train import main as train_main

    run = runs_dir / "runs" / method
    if not (run / "train_summary.json").is_file():
        table = runs_dir / "train.parquet"
        if not table.is_file():
            _table(table)
        rewards = "rewards=[" + ", ".join(f'{{"name": "{r}"}}' for r in OFFLINE) + "]"
        sets = [f"model.path={model}", f"data.train={table}", "sampling.num_steps=2", "sampling.resolution=32",
                "sampling.images_per_prompt=2", "sampling.batch_size=6", "sampling.num_batches_per_epoch=1",
                "train.batch_size=3", "train.seed=0", f"balancer.method={method}", rewards, *_zoo(method)]
        assert train_main(["--preset", "tiny", "--output-dir", str(run), "--no-progress", "--max-steps", "1",
                           *[x for s in sets for x in ("--set", s)]]) == 0
    return run


@pytest.mark.parametrize("method", METHODS)
def test_every_balancer_trains_a_step_on_every_offline_reward(method, tiny_model_dir, runs_dir):
    run = _train(method, tiny_model_dir, runs_dir)
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["step"] == 1 and last["balancer"] == method
    assert {f"reward/{r}" for r in OFFLINE} <= set(last), sorted(last)
    assert math.isfinite(last["loss/policy"])
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["final_step"] == 1


def test_the_report_over_every_balancer_names_each(tiny_model_dir, runs_dir, tmp_path):
    """The pipeline's report over one run of each balancer: every one is drawn and labelled
    from its descriptor (a zoo method without torchjd here is simply not among the runs)."""
    from marble.report import ReportInputs, build_report

    trained = []
    for method in METHODS:
        try:
            _train(method, tiny_model_dir, runs_dir)
            trained.append(method)
        except pytest.skip.Exception:
            pass
    build_report(ReportInputs(runs_dir=runs_dir / "runs", out=tmp_path / "report"))
    text = (tmp_path / "report" / "report.md").read_text()
    for method in trained:
        assert balancer_descriptor(method).label in text or f"`{method}`" in text, method


# ------------------------------------------------------------------ every reward scores


@pytest.fixture(scope="module")
def reward_ckpts(tmp_path_factory):
    """A reward-checkpoint folder as `marble download rewards` leaves it, from the tiny replicas."""
    import shutil

    from beds import replicas, replicas_hps
    from beds.mirror import _hub_builders

    from marble.assets.manifest import load_manifest

    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("reward_ckpts")
    builders = _hub_builders(0)
    for e in load_manifest():
        if e.group == "rewards" and e.repo in builders:
            if not (src / e.repo).is_dir():
                builders[e.repo](src / e.repo)
            if (src / e.repo / e.remote).is_file():
                (out / e.path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src / e.repo / e.remote, out / e.path)
    replicas.aesthetic_head(out / "sac+logos+ava1-l14-linearMSE.pth", 6)
    (out / "geneval").mkdir()
    replicas.object_names(out / "geneval/object_names.txt")
    replicas_hps.write_hps_config(out / "marble-tiny-hps.json")
    return out


# The import a reward's scorer needs beyond the core install, and the extra that brings it.
STACKS = {"open_clip": ("open_clip", "clip"), "onnx_ocr": ("rapidocr_onnxruntime", "ocr")}


@pytest.mark.parametrize("name", [d.name for d in descriptors()])
def test_every_reward_scores_a_batch(name, reward_ckpts, monkeypatch):
    from beds.fake_sglang import FakeSglangServer
    from beds.mirror import replica_reward_options

    d = next(x for x in descriptors() if x.name == name)
    if d.replica in STACKS:
        needs(*STACKS[d.replica])
    monkeypatch.setenv("MARBLE_REWARD_CKPTS", str(reward_ckpts))  # as the workflow rules set it
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    options = replica_reward_options(reward_ckpts).get(name, {})
    scorer_options = {**options, **({"ckpt_dir": str(reward_ckpts)} if options else {})}
    prompts = [p.prompt for p in PROMPTS]
    metadata = [{**p.metadata, "source": p.source} for p in PROMPTS]
    with FakeSglangServer(idle_s=60) as server:
        if d.judge:
            monkeypatch.setenv(f"MARBLE_{name.upper()}_URL", server.url)
        scorer = build_scorers([RewardSpec(name=name, options=scorer_options)])[name]
        scores = scorer(torch.rand(3, 3, 32, 32), prompts, metadata)
    assert scores.shape == (3,)
    applies = torch.tensor([scorer.applies(p, m) for p, m in zip(prompts, metadata)])
    assert torch.isfinite(scores[applies]).all(), (name, scores)
