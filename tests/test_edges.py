"""Tests at the edges where hand mutations survived the narrow tests (issue 40): config
cross-field checks, the embedding cache's identity, each zoo weighting's input and options,
results revisions, pruning under several `keep` values. Each bug they catch is a mutant of
marble/tools/mutants_catalogue.py (section "edges")."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from extras import needs
import torch

from marble.config import ConfigError, load_config

# ------------------------------------------------------------------ config cross-field checks


def test_train_batch_must_divide_the_rollouts_of_all_batches_not_of_one():
    """6 rollouts x 2 batches = 12 per rank: train.batch_size 4 divides it (6 alone it does not)."""
    sets = ["sampling.batch_size=6", "train.batch_size=4"]
    cfg = load_config("tiny", overrides=[*sets, "sampling.num_batches_per_epoch=2"])
    assert cfg.train.batch_size == 4
    with pytest.raises(ConfigError, match=r"must divide the rollouts per rank per epoch .* = 6\)"):
        load_config("tiny", overrides=[*sets, "sampling.num_batches_per_epoch=1"])


def test_fixed_alphas_need_k_values_that_sum_to_one():
    """The tiny preset's K = 4: four values summing to 1.1 are refused as three values are."""
    cfg = load_config("tiny", overrides=["balancer.method=equal_alpha",
                                         "balancer.fixed_alphas=[0.4, 0.3, 0.2, 0.1]"])
    assert cfg.balancer.fixed_alphas == [0.4, 0.3, 0.2, 0.1]
    for bad in ("[0.5, 0.3, 0.2, 0.1]", "[0.5, 0.3, 0.2]"):
        with pytest.raises(ConfigError, match="needs 4 values summing to 1"):
            load_config("tiny", overrides=["balancer.method=equal_alpha", f"balancer.fixed_alphas={bad}"])


# ------------------------------------------------------------------ the embedding cache's identity


def test_the_cache_key_changes_with_model_length_and_prompt():
    from marble.data.embed_cache import prompt_key

    keys = {prompt_key("a cat", 128, "m"), prompt_key("a cat", 256, "m"), prompt_key("a cat", 128, "n"),
            prompt_key("a dog", 128, "m")}
    assert len(keys) == 4


def test_the_model_identity_reads_tokenizer_contents_not_only_sizes(tmp_path):
    """A retrained tokenizer of the same size is another model: its cached embeddings differ."""
    from marble.data.embed_cache import model_identity

    (tmp_path / "m" / "tokenizer").mkdir(parents=True)
    (tmp_path / "m" / "transformer").mkdir()
    vocab = tmp_path / "m" / "tokenizer" / "vocab.json"
    vocab.write_text('{"a": 1}')
    (tmp_path / "m" / "transformer" / "config.json").write_text("{}")
    before = model_identity(str(tmp_path / "m"))
    (tmp_path / "m" / "transformer" / "config.json").write_text('{"x": 1}')  # not a text part
    assert model_identity(str(tmp_path / "m")) == before
    vocab.write_text('{"b": 1}')  # same size, other vocabulary
    assert model_identity(str(tmp_path / "m")) != before


@pytest.mark.parametrize("key, value", [("model", "other"), ("max_sequence_length", 256), ("dtype", "bf16")])
def test_a_cache_built_for_another_model_length_or_dtype_is_refused(tmp_path, key, value):
    from marble.data import embed_cache

    asked = {"model": "m", "max_sequence_length": 128, "dtype": "fp16"}
    index = embed_cache._load_index(tmp_path, *asked.values())  # a new cache: nothing to compare
    (tmp_path / embed_cache.INDEX).write_text(json.dumps({**index, key: value}))
    with pytest.raises(ValueError, match=f"cache built for {key}="):
        embed_cache._load_index(tmp_path, *asked.values())


# ------------------------------------------------------------------ each zoo weighting's input and options


def _gramian(name: str, options: str | None = None):
    needs("torchjd.aggregation", "zoo")
    from marble.balancers import build_balancer

    sets = ["balancer.method=gramian", f"balancer.weighting={name}"]
    cfg = load_config("tiny", overrides=sets + ([f"balancer.weighting_options={options}"] if options else []))
    return build_balancer(cfg.balancer, cfg.reward_names)


class Recorder:
    """Stands for a torchjd weighting: `__call__(stat) -> weights`, recording what it is handed."""

    def __call__(self, stat: torch.Tensor) -> torch.Tensor:
        self.stat = stat
        return torch.full((len(stat),), 1.0 / len(stat), dtype=stat.dtype)


@pytest.mark.parametrize("name", ["mgda", "upgrad", "cagrad", "nash_mtl", "imtl_g", "dualproj",
                                  "aligned_mtl", "pcgrad", "random", "fairgrad"])
def test_each_weighting_reads_the_gramian_or_its_factor(name):
    """A Gramian weighting gets G itself; a Matrix one (Nash-MTL, random) a factor F with F F^T = G
    (its rows stand for the unit gradients), never G in F's place."""
    from marble.balancers.weightings import WEIGHTINGS

    bal = _gramian(name)
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((3, 5))
    gram = (rows / np.linalg.norm(rows, axis=1, keepdims=True)) @ (rows / np.linalg.norm(rows, axis=1, keepdims=True)).T
    bal._weightings[(0, 1, 3)] = recorder = Recorder()
    w = bal.solve_weights(SimpleNamespace(global_step=0, micro_index=0), gram, (0, 1, 3))
    assert w.tolist() == pytest.approx([1 / 3] * 3)
    stat = recorder.stat.numpy()
    if WEIGHTINGS[name].reads == "matrix":
        assert stat @ stat.T == pytest.approx(gram, abs=1e-12) and not np.allclose(stat, gram)
    else:
        assert np.array_equal(stat, gram)


@pytest.mark.parametrize("name, key, default", [("cagrad", "c", 0.5), ("fairgrad", "alpha", 1.0),
                                                ("nash_mtl", "max_norm", 1.0)])
def test_configured_weighting_options_override_the_tables_defaults(name, key, default):
    assert _gramian(name).options[key] == default
    bal = _gramian(name, f"{{{key}: 0.25}}")
    assert bal.options[key] == 0.25
    made = bal._make((0, 1))  # a fresh torchjd object for two rewards gets the same option
    assert getattr(made, f"_{key}") == 0.25  # torchjd keeps a constructor option as `_<name>`


# ------------------------------------------------------------------ results revisions


def _results(tmp_path, *rows) -> object:
    path = tmp_path / "evaluation_results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_each_revision_must_be_the_next_one(tmp_path):
    from marble.evaluation.results import ResultsError, read_results

    first, second = {"sample_id": 0, "rev": 1, "scores": {"a": 1.0}}, {"sample_id": 0, "rev": 2, "scores": {"a": 2.0}}
    assert read_results(_results(tmp_path, first, second))[0]["scores"] == {"a": 2.0}  # the later wins
    for rows in ((first, {**second, "rev": 3}), (first, second, second), (first, {**first, "scores": {"a": 5.0}})):
        with pytest.raises(ResultsError, match="appears again as revision"):
            read_results(_results(tmp_path, *rows))
    legacy = [{"sample_id": 0, "scores": {"a": 1.0}}, {"sample_id": 0, "scores": {"a": 3.0}}]
    assert read_results(_results(tmp_path, *legacy))[0]["scores"] == {"a": 3.0}  # files from before revisions


# ------------------------------------------------------------------ pruning under several keep values


def _fake_checkpoint(run, step: int) -> None:
    from marble.training.checkpoint_format import COMPLETE, checkpoint_dir, marker_text

    path = checkpoint_dir(run, step)
    path.mkdir(parents=True)
    (path / "state.pt").write_bytes(bytes([step]) * 8)
    (path / COMPLETE).write_text(marker_text(path))


@pytest.mark.parametrize("keep, kept", [(1, [6]), (2, [5, 6]), (3, [3, 5, 6]), (5, [1, 2, 3, 5, 6])])
def test_pruning_keeps_the_newest_usable_ones_and_no_older_damaged_one(tmp_path, keep, kept):
    from marble.training.checkpoint import prune_checkpoints
    from marble.training.checkpoint_format import checkpoint_dir, list_checkpoints

    for step in (1, 2, 3, 4, 5, 6):
        _fake_checkpoint(tmp_path, step)
    (checkpoint_dir(tmp_path, 4) / "state.pt").write_bytes(b"damaged!")  # fails its sha256
    prune_checkpoints(tmp_path, keep)
    left = [s for s, _ in list_checkpoints(tmp_path)]
    # the damaged step 4 stays only where it is newer than the oldest kept checkpoint
    assert left == sorted(kept + ([4] if kept[0] < 4 else []))
