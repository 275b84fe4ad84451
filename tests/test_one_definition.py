"""One definition per concept: the copies that used to drift now share one implementation."""

from __future__ import annotations

import hashlib

import pytest

from marble import rewards as registry
from marble.config import RewardSpec
from marble.data import tiny_prompts
from marble.rewards import geneval_rules
from marble.rewards.base import Reward
from marble.rewards.toy import GENEVAL_COLORS
from marble.runtime.io import sha256_file


def test_one_list_of_geneval_colours():
    # the tiny prompt generator, the toy colour reward and the GenEval rules name the same colours
    assert tiny_prompts.COLORS is geneval_rules.COLORS
    assert tuple(GENEVAL_COLORS) == geneval_rules.COLORS
    # a hand-checked pair of CSS values: the zip kept names and RGB aligned
    assert GENEVAL_COLORS["orange"] == (255, 165, 0) and GENEVAL_COLORS["white"] == (255, 255, 255)


def test_file_sha256_matches_hashlib_across_chunk_boundaries(tmp_path):
    payload = bytes(range(256)) * 9000  # 2.3 MB: more than two 1 MiB blocks
    path = tmp_path / "blob.bin"
    path.write_bytes(payload)
    assert sha256_file(path) == hashlib.sha256(payload).hexdigest()
    assert sha256_file(path, chunk=7) == hashlib.sha256(payload).hexdigest()


class DeviceProbe(Reward):
    """A registry entry with a `device` argument, like the model-based scorers."""

    def __init__(self, device: str = "cpu", scale: float = 1.0, **options):
        super().__init__(**options)
        self.device, self.scale = device, scale

    def score(self, images, prompts, metadata):  # never called here
        raise NotImplementedError


PROBE = registry.RewardDescriptor("probe", f"{__name__}:DeviceProbe", flops=0.0)


def test_build_scorers_gives_the_device_only_where_asked(monkeypatch):
    monkeypatch.setitem(registry.REGISTRY, "probe", PROBE)
    specs = [RewardSpec(name="probe", applies_to=["ocr"], options={"scale": 2.0}),
             RewardSpec(name="toy_brightness")]
    trained = registry.build_scorers(specs, device="cuda:3")  # training: train.reward_device
    assert trained["probe"].device == "cuda:3" and trained["probe"].scale == 2.0
    assert trained["probe"].applies("p", {"source": "ocr"})
    assert not trained["probe"].applies("p", {"source": "pickscore"})  # the applies_to override
    assert set(trained) == {"probe", "toy_brightness"}
    evaluated = registry.build_scorers(specs)  # evaluation: each reward's own default device
    assert evaluated["probe"].device == "cpu"
    pinned = registry.build_scorers([RewardSpec(name="probe", options={"device": "cpu"})], device="cuda:0")
    assert pinned["probe"].device == "cpu"  # an explicit option wins


def test_build_masks_loads_nothing_and_honours_the_override(monkeypatch):
    monkeypatch.setitem(registry.REGISTRY, "probe", PROBE)
    masks = registry.build_masks([RewardSpec(name="probe", applies_to=["geneval"])])
    assert not hasattr(masks["probe"], "device")  # the constructor (weights) never ran
    assert masks["probe"].applies("p", {"source": "geneval"})
    with pytest.raises(KeyError, match="unknown reward"):
        registry.build_masks([RewardSpec(name="nope")])


def test_the_mask_column_prefix_is_spelled_once():
    """`applies__` lives in marble/data/records.py (MASK_PREFIX); a second spelling (training
    once built `f"applies__{name}"` itself) is a second reader that can drift from it."""
    import ast
    from pathlib import Path

    from marble.data.records import MASK_PREFIX

    root = Path(__file__).resolve().parents[1] / "marble"
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if MASK_PREFIX not in text:
            continue  # parse only the candidates (docstrings that name the columns pass below)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and node.value.startswith(MASK_PREFIX):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    assert found == [f"marble/data/records.py:{_prefix_line(root / 'data' / 'records.py')}"], found


def _prefix_line(path) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1)
                if line.startswith("MASK_PREFIX = "))


def test_training_reads_the_masks_the_data_layer_writes():
    import pandas as pd
    import torch

    from marble.data.records import PromptRecord, compute_masks, reward_masks, to_frame
    from marble.training.rollout import applicable_mask

    rows = [PromptRecord.make("a", "ocr"), PromptRecord.make("b", "pickscore"),
            PromptRecord.make("c", "ocr")]
    ocr_only = registry.applicability("toy_brightness", applies_to=["ocr"])
    table = to_frame(rows, compute_masks(rows, {"ocr_only": ocr_only}))
    assert isinstance(table, pd.DataFrame)
    assert reward_masks(table) == {"ocr_only": [True, False, True]}
    assert reward_masks(table, ["missing", "ocr_only"]) == {"ocr_only": [True, False, True]}
    # training: the table's mask where it has one, else 'scored' (the reward's own NaN rule)
    rewards = torch.tensor([[0.5, float("nan")], [0.1, 0.2], [0.3, 0.4]])
    mask = applicable_mask(table, ["ocr_only", "unmasked"], torch.tensor([2, 1, 0]), rewards)
    assert mask.tolist() == [[True, False], [False, True], [True, True]]


# Reward names that are also the names of benchmark prompt sets and prompt sources (the data
# layer's `source`, evaluation's datasets): there the string names a dataset, not the reward.
# Each dataset has one spelling outside the data layer, marble.evaluation.datasets (GENEVAL, OCR,
# PICKSCORE, DRAWBENCH); the data layer below it spells its prompt sources itself (it may not
# import evaluation), held equal to the datasets below. Only these homes are left out of the
# count: every other file that names a dataset counts against the three.
DATASET_NAMED = {"pickscore", "geneval", "ocr"}
DATASET_FILES = {"marble/evaluation/datasets.py", "marble/data/assemble.py", "marble/data/tiny_prompts.py"}


def test_the_data_layers_sources_are_the_evaluation_datasets():
    from marble.data.assemble import SOURCES
    from marble.evaluation.datasets import DATASETS

    assert set(SOURCES) == set(DATASETS)


def _string_constants(root) -> dict[str, set[str]]:
    """{string: files of marble/ where it is a constant}, docstrings left out."""
    import ast

    found: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                found.setdefault(node.value, set()).add(path.relative_to(root.parent).as_posix())
    return found


def test_a_reward_name_keys_at_most_three_files():
    """Its scorer module, the catalogue of descriptors, at most one more: every other table that
    keyed a reward by name (the doctor's modules and extras, the FLOPs, the evaluation sets, the
    GPU check's sizes, ...) reads the descriptor (docs/ARCHITECTURE.md, "Add a reward")."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "marble"
    constants = _string_constants(root)
    over = {}
    for name in registry.available():
        files = constants.get(name, set())
        if name in DATASET_NAMED:
            files = files - DATASET_FILES
        if len(files) > 3:
            over[name] = sorted(files)
    assert not over, over
    # every listed file still uses a dataset name (a stale entry would hide a reward key)
    dataset_files = set().union(*(constants.get(n, set()) for n in DATASET_NAMED))
    assert dataset_files & DATASET_FILES == DATASET_FILES, sorted(DATASET_FILES - dataset_files)


def test_the_requeue_exit_code_has_one_home():
    """workflow/scripts/torchrun_slurm.sh reads EXIT_REQUEUE from marble.training.stopping; a
    number of its own (`EXIT_REQUEUE=75`) could drift from what `marble train` exits with."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    from marble.training.stopping import EXIT_REQUEUE

    script = (Path(__file__).resolve().parents[1] / "workflow/scripts/torchrun_slurm.sh").read_text()
    code = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("#"))
    assert not re.search(rf"\b{EXIT_REQUEUE}\b", code), "the wrapper spells the requeue code itself"
    line = next(line for line in code.splitlines() if line.startswith("EXIT_REQUEUE="))
    command = re.search(r"\$\((.*)\)", line).group(1).replace("python", sys.executable, 1)
    out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(EXIT_REQUEUE)
