"""ImageReward on a tiny random checkpoint in the real on-disk format (ImageReward.pt with the
image-reward package's parameter names + med_config.json + a BERT tokenizer folder), scoring
real images; the expected scores come from an independent plain-torch forward of BLIP's
ViT and BERT-MED written from the architecture, not from marble's loader."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from marble.rewards import build

V_WIDTH, V_DEPTH, PATCH, IMAGE = 128, 2, 32, 224  # 2 heads of 64, 7x7 patches at 224 as the real one
T_HIDDEN, T_LAYERS, T_HEADS, T_INTER, T_POS = 32, 2, 2, 64, 64
WORDS = ["a", "cat", "photo", "of", "the", "astronaut", "nasa", "on", "sofa", "##s"]


def tiny_state(vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights under the names image-reward's ImageReward module saves."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=0.2):
        return torch.randn(*shape, generator=g) * scale

    def norm(prefix, dim):
        return {f"{prefix}.weight": 1 + r(dim, scale=0.05), f"{prefix}.bias": r(dim, scale=0.05)}

    def linear(prefix, n_out, n_in):
        return {f"{prefix}.weight": r(n_out, n_in), f"{prefix}.bias": r(n_out, scale=0.05)}

    v, t = "blip.visual_encoder", "blip.text_encoder"
    s = {f"{v}.cls_token": r(1, 1, V_WIDTH), f"{v}.pos_embed": r(1, (IMAGE // PATCH) ** 2 + 1, V_WIDTH),
         f"{v}.patch_embed.proj.weight": r(V_WIDTH, 3, PATCH, PATCH, scale=0.02),
         f"{v}.patch_embed.proj.bias": r(V_WIDTH, scale=0.05), **norm(f"{v}.norm", V_WIDTH)}
    for i in range(V_DEPTH):
        b = f"{v}.blocks.{i}"
        s |= {**norm(f"{b}.norm1", V_WIDTH), **linear(f"{b}.attn.qkv", 3 * V_WIDTH, V_WIDTH),
              **linear(f"{b}.attn.proj", V_WIDTH, V_WIDTH), **norm(f"{b}.norm2", V_WIDTH),
              **linear(f"{b}.mlp.fc1", 4 * V_WIDTH, V_WIDTH), **linear(f"{b}.mlp.fc2", V_WIDTH, 4 * V_WIDTH)}
    s |= {f"{t}.embeddings.word_embeddings.weight": r(vocab, T_HIDDEN),
          f"{t}.embeddings.position_embeddings.weight": r(T_POS, T_HIDDEN),
          f"{t}.embeddings.position_ids": torch.arange(T_POS)[None], **norm(f"{t}.embeddings.LayerNorm", T_HIDDEN)}
    for i in range(T_LAYERS):
        b = f"{t}.encoder.layer.{i}"
        for kind, kv_in in (("attention", T_HIDDEN), ("crossattention", V_WIDTH)):
            s |= {**linear(f"{b}.{kind}.self.query", T_HIDDEN, T_HIDDEN),
                  **linear(f"{b}.{kind}.self.key", T_HIDDEN, kv_in),
                  **linear(f"{b}.{kind}.self.value", T_HIDDEN, kv_in),
                  **linear(f"{b}.{kind}.output.dense", T_HIDDEN, T_HIDDEN),
                  **norm(f"{b}.{kind}.output.LayerNorm", T_HIDDEN)}
        s |= {**linear(f"{b}.intermediate.dense", T_INTER, T_HIDDEN), **linear(f"{b}.output.dense", T_HIDDEN, T_INTER),
              **norm(f"{b}.output.LayerNorm", T_HIDDEN)}
    s |= {**linear("blip.vision_proj", 256, V_WIDTH), **linear("blip.text_proj", 256, T_HIDDEN)}  # unused by scoring
    for idx, (n_out, n_in) in zip((0, 2, 4, 6, 7), ((1024, T_HIDDEN), (128, 1024), (64, 128), (16, 64), (1, 16))):
        s |= linear(f"mlp.layers.{idx}", n_out, n_in)
    return s


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    from transformers import BertTokenizer

    folder = tmp_path_factory.mktemp("imagereward")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizer(str(folder / "vocab.txt"), do_lower_case=True).save_pretrained(folder / "bert-base-uncased")
    (folder / "vocab.txt").unlink()
    med = {"architectures": ["BertModel"], "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
           "hidden_dropout_prob": 0.1, "hidden_size": T_HIDDEN, "initializer_range": 0.02,
           "intermediate_size": T_INTER, "layer_norm_eps": 1e-12, "max_position_embeddings": T_POS,
           "model_type": "bert", "num_attention_heads": T_HEADS, "num_hidden_layers": T_LAYERS, "pad_token_id": 0,
           "type_vocab_size": 2, "vocab_size": len(vocab) + 2, "encoder_width": 768, "add_cross_attention": True}
    (folder / "med_config.json").write_text(json.dumps(med))
    torch.save(tiny_state(len(vocab) + 2), folder / "ImageReward.pt")
    return folder


def _heads(x, n):
    b, length, d = x.shape
    return x.view(b, length, n, d // n).transpose(1, 2)


def _attend(q, k, v, n, add_mask=None):
    q, k, v = _heads(q, n), _heads(k, n), _heads(v, n)
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if add_mask is not None:
        logits = logits + add_mask
    out = logits.softmax(-1) @ v
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


def oracle(state, pixels, ids, mask):
    """BLIP ViT (timm, pre-norm) -> BERT-MED (post-norm, cross-attention) -> head, in plain torch."""
    s = {k: v.double() for k, v in state.items()}
    lin = lambda x, p: x @ s[f"{p}.weight"].T + s[f"{p}.bias"]  # noqa: E731
    ln = lambda x, p, eps: F.layer_norm(x, x.shape[-1:], s[f"{p}.weight"], s[f"{p}.bias"], eps)  # noqa: E731
    v = "blip.visual_encoder"
    x = F.conv2d(pixels.double(), s[f"{v}.patch_embed.proj.weight"], s[f"{v}.patch_embed.proj.bias"], stride=PATCH)
    x = torch.cat([s[f"{v}.cls_token"].expand(len(x), 1, -1), x.flatten(2).transpose(1, 2)], 1) + s[f"{v}.pos_embed"]
    for i in range(V_DEPTH):
        b = f"{v}.blocks.{i}"
        h = ln(x, f"{b}.norm1", 1e-6)
        q, k, val = lin(h, f"{b}.attn.qkv").chunk(3, dim=-1)
        x = x + lin(_attend(q, k, val, V_WIDTH // 64), f"{b}.attn.proj")
        x = x + lin(F.gelu(lin(ln(x, f"{b}.norm2", 1e-6), f"{b}.mlp.fc1")), f"{b}.mlp.fc2")
    image = ln(x, f"{v}.norm", 1e-6)
    t = "blip.text_encoder"
    positions = s[f"{t}.embeddings.position_embeddings.weight"][: ids.shape[1]]
    e = s[f"{t}.embeddings.word_embeddings.weight"][ids] + positions
    e = ln(e, f"{t}.embeddings.LayerNorm", 1e-12)
    add_mask = (1.0 - mask.double())[:, None, None, :] * -10000.0
    for i in range(T_LAYERS):
        b = f"{t}.encoder.layer.{i}"
        for kind, kv, m in (("attention", None, add_mask), ("crossattention", image, None)):
            src = e if kv is None else kv
            a = _attend(lin(e, f"{b}.{kind}.self.query"), lin(src, f"{b}.{kind}.self.key"),
                        lin(src, f"{b}.{kind}.self.value"), T_HEADS, m)
            e = ln(lin(a, f"{b}.{kind}.output.dense") + e, f"{b}.{kind}.output.LayerNorm", 1e-12)
        e = ln(lin(F.gelu(lin(e, f"{b}.intermediate.dense")), f"{b}.output.dense") + e, f"{b}.output.LayerNorm", 1e-12)
    r = e[:, 0]
    for idx in (0, 2, 4, 6, 7):
        r = lin(r, f"mlp.layers.{idx}")
    return ((r.squeeze(-1) - 0.16717362830052426) / 1.0333394966054072).float()


def load_images(shared_dir, names):
    from PIL import Image

    out = []
    for name in names:
        with Image.open(shared_dir / "images" / name) as im:
            arr = np.asarray(im.convert("RGB").resize((256, 192)))  # non-square: exercises resize + crop
        out.append(torch.from_numpy(arr.copy()).permute(2, 0, 1).float() / 255)
    return torch.stack(out)


def test_scores_real_images_like_the_blip_architecture(ckpt_dir, shared_dir):
    from marble.rewards.base import to_pil
    from marble.rewards.blip import load_tokenizer, preprocess

    images = load_images(shared_dir, ["cat.jpg", "nasa.jpg", "cat.jpg"])
    prompts = ["a photo of a cat", "the nasa astronaut", "a photo of the nasa sofas on a sofa cat"]
    reward = build("imagereward", ckpt_dir=str(ckpt_dir), batch_size=2)
    out = reward(images, prompts)
    assert out.shape == (3,) and out.dtype == torch.float32 and torch.isfinite(out).all()
    tokenizer = load_tokenizer(ckpt_dir / "bert-base-uncased")
    assert len(tokenizer) == 17  # 15 words + BLIP's [DEC] and [ENC], as med_config's vocab_size
    tok = tokenizer(prompts, padding="max_length", truncation=True, max_length=35, return_tensors="pt")
    pixels = torch.stack([preprocess(im, IMAGE) for im in to_pil(images)])
    expected = oracle(torch.load(ckpt_dir / "ImageReward.pt", weights_only=True), pixels, tok.input_ids,
                      tok.attention_mask)
    assert torch.allclose(out, expected, atol=1e-4), (out, expected)
    assert out[0] != out[1] and out[0] != out[2]  # the prompt and the image both matter


def test_preprocess_is_resize_short_side_then_centre_crop():
    from PIL import Image

    from marble.rewards.blip import CLIP_MEAN, CLIP_STD, preprocess

    image = Image.new("RGB", (300, 100), (255, 0, 0))
    image.paste((0, 255, 0), (100, 0, 200, 100))  # middle third green
    x = preprocess(image, 100)
    assert x.shape == (3, 100, 100)
    green = (torch.tensor([0.0, 1.0, 0.0]) - torch.tensor(CLIP_MEAN)) / torch.tensor(CLIP_STD)
    assert torch.allclose(x[:, 50, 50], green, atol=1e-5)
    assert torch.allclose(x[:, :, 5:95].mean((1, 2)), green, atol=1e-2)


def test_missing_and_foreign_files_are_clear_errors(ckpt_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="ImageReward.pt is missing.*marble download rewards"):
        build("imagereward", ckpt_dir=str(tmp_path))
    for name in ("ImageReward.pt", "med_config.json"):
        (tmp_path / name).write_bytes((ckpt_dir / name).read_bytes())
    # neither bert-base-uncased/ beside the checkpoint nor the download's hub/google-bert/bert-base-uncased
    with pytest.raises(FileNotFoundError, match="hub/google-bert/bert-base-uncased is missing.*marble download"):
        build("imagereward", ckpt_dir=str(tmp_path))
    state = torch.load(ckpt_dir / "ImageReward.pt", weights_only=True)
    state["blip.visual_encoder.head.weight"] = torch.zeros(1)
    torch.save(state, tmp_path / "ImageReward.pt")
    tokenizer = str(ckpt_dir / "bert-base-uncased")
    with pytest.raises(KeyError, match="unexpected vision parameter 'head.weight'"):
        build("imagereward", ckpt_dir=str(tmp_path), tokenizer=tokenizer)
    del state["blip.visual_encoder.head.weight"], state["mlp.layers.7.bias"]
    torch.save(state, tmp_path / "ImageReward.pt")
    with pytest.raises(KeyError, match=r"does not fit the mlp module: missing \['layers.7.bias'\]"):
        build("imagereward", ckpt_dir=str(tmp_path), tokenizer=tokenizer)


def test_unused_checkpoint_entries_are_named_and_ignored(ckpt_dir, caplog):
    from marble.rewards.blip import map_state_dict

    state = torch.load(ckpt_dir / "ImageReward.pt", weights_only=True)
    state["blip.visual_encoder_m.cls_token"] = torch.zeros(1)  # e.g. a training-time momentum copy
    with caplog.at_level("WARNING"):
        parts = map_state_dict(state)
    assert "blip.visual_encoder_m.cls_token" in caplog.text
    assert "embeddings.class_embedding" in parts["visual"] and "layers.7.weight" in parts["mlp"]
