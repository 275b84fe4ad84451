"""Build and save a tiny random-init CLIP (model, BPE tokenizer, image processor) offline."""

from __future__ import annotations

import json
from pathlib import Path

from beds.replicas import _byte_chars  # the one CLIP byte alphabet


def save_tiny_clip(out: Path, projection_dim: int = 16, image_size: int = 32, seed: int = 0) -> Path:
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    out.mkdir(parents=True, exist_ok=True)
    chars = _byte_chars()
    vocab = {tok: i for i, tok in enumerate(chars + [c + "</w>" for c in chars] + ["<|startoftext|>", "<|endoftext|>"])}
    (out / "vocab.json").write_text(json.dumps(vocab))
    (out / "merges.txt").write_text("#version: 0.2\n")  # character-level BPE: no merges
    # Positional: transformers 5 ignores vocab_file= / merges_file= (tests/beds/replicas.py).
    tokenizer = CLIPTokenizer(str(out / "vocab.json"), str(out / "merges.txt"), model_max_length=77)
    images = CLIPImageProcessor(size={"shortest_edge": image_size},
                                crop_size={"height": image_size, "width": image_size})
    CLIPProcessor(image_processor=images, tokenizer=tokenizer).save_pretrained(out)
    config = CLIPConfig(
        text_config=dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=77, bos_token_id=len(vocab) - 2,
                         eos_token_id=len(vocab) - 1, pad_token_id=len(vocab) - 1),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=image_size, patch_size=8),
        projection_dim=projection_dim,
    )
    torch.manual_seed(seed)
    CLIPModel(config).save_pretrained(out)
    return out
