"""The tokenizers of the dev replicas (tests/beds/replicas.py) tokenize words.

Loaded through the loaders the rewards use (BLIP's `load_tokenizer`, `CLIPProcessor`): two
prompts of equal length must get different ids, with no unknown token, or every check through
the replica folders (the mirror, paper-mini) scores all prompts of a length alike.
"""

from __future__ import annotations

import json

PROMPTS = ["a red dog", "a blue cat"]  # equal length, different words


def test_bert_replica_tokenizes_words(tmp_path):
    from marble.rewards.blip import load_tokenizer
    from beds.replicas import bert_repo, bert_vocab

    bert_repo(tmp_path)
    saved = json.loads((tmp_path / "tokenizer.json").read_text())["model"]["vocab"]
    assert len(saved) == len(bert_vocab())  # not only the 5 special tokens
    tok = load_tokenizer(tmp_path)
    a, b = (tok(p).input_ids for p in PROMPTS)
    assert len(a) == len(b) and a != b
    assert tok.unk_token_id not in a + b
    assert tok.convert_ids_to_tokens(a) == ["[CLS]", "a", "red", "dog", "[SEP]"]


def test_clip_replica_tokenizes_words(tmp_path):
    from transformers import CLIPProcessor

    from beds.replicas import clip_repo

    clip_repo(tmp_path)
    tok = CLIPProcessor.from_pretrained(str(tmp_path)).tokenizer
    a, b = (tok(p).input_ids for p in ["a red dog", "a bed dog"])  # one letter apart
    assert len(a) == len(b) and a != b
    assert tok.unk_token_id not in a[1:-1] + b[1:-1]


def test_real_clip_sizes_have_the_published_parameter_counts():
    """The gpu check's real-size replicas (CLIP_ARCHS) are the hub models' architectures: counted
    on the meta device (no memory), against openai/clip-vit-large-patch14 and
    laion/CLIP-ViT-H-14-laion2B-s32B-b79K's parameter counts."""
    import torch
    from transformers import CLIPModel

    from beds.replicas import clip_config

    with torch.device("meta"):
        counts = {size: sum(p.numel() for p in CLIPModel(clip_config(size, 514)).parameters())
                  for size in ("ViT-L-14", "ViT-H-14")}
    assert counts == {"ViT-L-14": 427_616_513, "ViT-H-14": 986_109_441}


def test_real_hps_size_is_open_clips_vit_h14():
    """HPSv2.1's real-size replica is drawn for open_clip's own ViT-H-14 config (the reward's default arch)."""
    import pytest

    open_clip = pytest.importorskip("open_clip", reason="needs open_clip (make test-clip env)")
    from beds.replicas_hps import OPEN_CLIP_VIT_H14

    real = open_clip.get_model_config("ViT-H-14")
    for tower in ("vision_cfg", "text_cfg"):
        assert {k: real[tower][k] for k in OPEN_CLIP_VIT_H14[tower]} == OPEN_CLIP_VIT_H14[tower], tower
    assert real["embed_dim"] == OPEN_CLIP_VIT_H14["embed_dim"]
