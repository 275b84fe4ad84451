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
