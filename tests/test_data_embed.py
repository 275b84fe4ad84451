"""Embedding cache: same tensors as on-the-fly encoding; resumable; a second run encodes nothing."""

from __future__ import annotations

import json

import pytest
import torch

from marble.data.cli import main as data_main
from marble.data.embed_cache import EmbeddingCache, build_cache


@pytest.fixture(scope="module")
def tiny_tables(tmp_path_factory):
    root = tmp_path_factory.mktemp("embed")
    assert data_main(["tiny", "--out", str(root / "raw"), "--n-train", "10", "--n-test", "3"]) == 0
    assert data_main(["assemble", "--raw-dir", str(root / "raw"), "--out-dir", str(root / "ds"),
                      "--rewards", "toy_brightness"]) == 0
    return root, [str(root / "ds" / "train.parquet"), str(root / "ds" / "test.parquet")]


def test_cache_matches_encoding_and_second_run_encodes_nothing(tiny_model_dir, tiny_tables, capsys):
    from marble.models import load_pipeline
    from marble.models.encode import encode_prompts

    root, tables = tiny_tables
    out = root / "cache"
    # first run: only the train table, shards of 8 prompts, so resuming is exercised below
    first = build_cache(tables[:1], str(tiny_model_dir), out, max_sequence_length=16, batch_size=4, shard_size=8)
    assert first == {"unique": 30, "encoded": 30, "cached": 0}
    assert len(json.loads((out / "index.json").read_text())["shards"]) == 4
    rc = data_main(["embed", "--table", tables[0], "--table", tables[1], "--model", str(tiny_model_dir),
                    "--out", str(out), "--max-sequence-length", "16", "--batch-size", "4"])
    assert rc == 0
    assert "42 unique prompts, 12 encoded, 30 already cached" in capsys.readouterr().out
    again = build_cache(tables, str(tiny_model_dir), out, max_sequence_length=16)
    assert again == {"unique": 42, "encoded": 0, "cached": 42}

    cache = EmbeddingCache(out)
    pipe = load_pipeline(str(tiny_model_dir))
    prompts = ['a chalkboard with the words "nope"']
    assert not cache.contains(prompts[0])
    with pytest.raises(KeyError, match="nope"):
        cache.lookup(prompts)
    import pandas as pd

    sample = pd.read_parquet(tables[1])["prompt"].tolist()[:5] + pd.read_parquet(tables[0])["prompt"].tolist()[:3]
    embeds, pooled = cache.lookup(sample)
    ref_embeds, ref_pooled = encode_prompts(pipe, sample, 16)
    assert embeds.shape == ref_embeds.shape and pooled.shape == ref_pooled.shape
    torch.testing.assert_close(embeds, ref_embeds, rtol=0, atol=1e-6)
    torch.testing.assert_close(pooled, ref_pooled, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="max_sequence_length"):
        build_cache(tables, str(tiny_model_dir), out, max_sequence_length=32)
    with pytest.raises(ValueError, match="dtype"):
        build_cache(tables, str(tiny_model_dir), out, max_sequence_length=16, dtype="float16")
    # half precision (encoded and stored): close to the fp32 encoding
    half = build_cache(tables[1:], str(tiny_model_dir), root / "cache16", max_sequence_length=16, dtype="float16")
    assert half["encoded"] == 12
    e16, _ = EmbeddingCache(root / "cache16").lookup(sample[:5])
    assert e16.dtype == torch.float16
    torch.testing.assert_close(e16.float(), ref_embeds[:5], rtol=1e-2, atol=1e-2)


def fake_base(root, encoder_bytes: bytes):
    """A base model folder whose text encoder weights are `encoder_bytes` (same names and sizes
    across calls with equal-length bytes): what model_identity sees, nothing loads it."""
    from safetensors.torch import save_file

    (root / "transformer").mkdir(parents=True)
    (root / "model_index.json").write_text("{}")
    save_file({"w": torch.zeros(8)}, str(root / "transformer" / "w.safetensors"))
    (root / "text_encoder").mkdir()
    (root / "text_encoder" / "config.json").write_text('{"hidden_size": 8}')
    save_file({"w": torch.frombuffer(bytearray(encoder_bytes), dtype=torch.uint8).float()},
              str(root / "text_encoder" / "model.safetensors"))
    return root


def test_model_identity_is_the_encoders_weights_not_their_names_and_sizes(tmp_path, monkeypatch):
    from marble.data.embed_cache import model_identity

    monkeypatch.setenv("MARBLE_HASH_CACHE", str(tmp_path / "hashes.json"))
    a = fake_base(tmp_path / "a" / "sd3", b"\x01" * 16)
    b = fake_base(tmp_path / "b" / "sd3", b"\x02" * 16)  # another base: same folder name, names, sizes
    weights = "text_encoder/model.safetensors"
    assert (a / weights).stat().st_size == (b / weights).stat().st_size
    assert model_identity(str(a)) != model_identity(str(b))
    # the content, not the place: a copy elsewhere under another name is the same encoders
    import shutil

    shutil.copytree(a, tmp_path / "moved")
    assert model_identity(str(tmp_path / "moved")) == model_identity(str(a))
    # the transformer's weights are not the encoders': a LoRA-merged base keeps its caches
    from safetensors.torch import save_file

    save_file({"w": torch.ones(8)}, str(a / "transformer" / "w.safetensors"))
    assert model_identity(str(a)) == model_identity(str(tmp_path / "moved"))
    assert model_identity("random:tiny") == "random:tiny"


def test_a_cache_of_another_bases_encoders_switched_on_at_resume_is_refused(tmp_path, monkeypatch):
    from marble.config import dump_yaml, load_config
    from marble.data.embed_cache import model_identity
    from marble.data.records import PromptRecord, to_frame
    from marble.training.inputs import current_inputs, write_inputs
    from marble.training.preflight import preflight
    from marble.training.run_dir import TrainError

    monkeypatch.setenv("MARBLE_HASH_CACHE", str(tmp_path / "hashes.json"))
    base = fake_base(tmp_path / "base", b"\x01" * 16)
    other = fake_base(tmp_path / "o" / "base", b"\x02" * 16)  # same folder name, names and sizes
    to_frame([PromptRecord.make("a cat", "pickscore")], {"toy_brightness": [True]}).to_parquet(tmp_path / "t.parquet")
    sets = [f"model.path={base}", f"data.train={tmp_path / 't.parquet'}", "rewards=[{name: toy_brightness}]"]
    cfg = load_config("tiny", overrides=sets)
    run = tmp_path / "run"  # a run started without a cache
    run.mkdir()
    (run / "config.yaml").write_text(dump_yaml(cfg))
    write_inputs(run, current_inputs(cfg))
    for name, built_for in (("own", model_identity(str(base))), ("foreign", model_identity(str(other))),
                            ("old", "local:base:0123456789abcdef")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "index.json").write_text(json.dumps(
            {"format": 1, "model": built_for, "max_sequence_length": 32, "dtype": "float32",
             "shards": [], "entries": {}, "checksums": {}}))
    preflight(load_config("tiny", overrides=sets + [f"data.embed_cache={tmp_path / 'own'}"]), run)
    with pytest.raises(TrainError, match=r"was built for text encoders 'encoders:sha256:\w+', .* holds") as err:
        preflight(load_config("tiny", overrides=sets + [f"data.embed_cache={tmp_path / 'foreign'}"]), run)
    assert "\n" not in str(err.value) and "marble data embed" in str(err.value)
    with pytest.raises(TrainError, match="built by an earlier marble.*rebuild it with `marble data embed`"):
        preflight(load_config("tiny", overrides=sets + [f"data.embed_cache={tmp_path / 'old'}"]), run)


def test_a_run_recorded_with_a_name_and_size_cache_identity_resumes_on_a_rebuilt_cache():
    from marble.training.inputs import input_differences

    base = {"model.path": {"path": "m", "fingerprint": "tree:1"}}
    old = {**base, "data.embed_cache": {"path": "c", "model": "local:sd3:0123", "max_sequence_length": 32}}
    rebuilt = {**base, "data.embed_cache": {"path": "c", "model": "encoders:sha256:ab", "max_sequence_length": 32}}
    assert input_differences(old, rebuilt) == []
    other = {**base, "data.embed_cache": {"path": "c", "model": "encoders:sha256:cd", "max_sequence_length": 32}}
    assert input_differences(rebuilt, other) and "data.embed_cache" in input_differences(rebuilt, other)[0]
