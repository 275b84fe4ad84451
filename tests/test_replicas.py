"""The tokenizers of the dev replicas (marble/tools/dev/replicas.py) tokenize words.

Loaded through the loaders the rewards use (BLIP's `load_tokenizer`, `CLIPProcessor`): two
prompts of equal length must get different ids, with no unknown token, or every check through
the replica folders (the mirror, paper-mini) scores all prompts of a length alike.
"""

from __future__ import annotations

import json

PROMPTS = ["a red dog", "a blue cat"]  # equal length, different words


def test_bert_replica_tokenizes_words(tmp_path):
    from marble.rewards.blip import load_tokenizer
    from marble.tools.dev.replicas import bert_repo, bert_vocab

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

    from marble.tools.dev.replicas import clip_repo

    clip_repo(tmp_path)
    tok = CLIPProcessor.from_pretrained(str(tmp_path)).tokenizer
    a, b = (tok(p).input_ids for p in ["a red dog", "a bed dog"])  # one letter apart
    assert len(a) == len(b) and a != b
    assert tok.unk_token_id not in a[1:-1] + b[1:-1]
