"""A tiny, SD3.5-Medium-shaped pipeline built from configs only (no downloads).

Same component classes as the real model (MMDiT-X transformer with a dual-attention
layer and RMS qk-norm, 16-channel x8 VAE, two CLIP encoders with projection, T5,
FlowMatch scheduler with shift 3), so every code path (from_pretrained, LoRA
targets, encode_prompt, the stock pipeline call) is exercised in seconds on a CPU.
Tokenizers are trained offline on the small corpus below.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from marble.runtime.io import atomic_path

# Widths chosen so diffusers' SD3 contracts hold: CLIP-L + CLIP-G hidden widths
# concatenate to the T5 width (= joint_attention_dim), and the two CLIP projections
# concatenate to pooled_projection_dim.
CLIP_HIDDEN = 32
CLIP_PROJECTION = 32
T5_WIDTH = 2 * CLIP_HIDDEN
HEADS, HEAD_DIM = 4, 16
CLIP_VOCAB_SIZE = 1000
T5_VOCAB_SIZE = 400

# SD3's VAE latent normalisation (from the SD3 / SD3.5 VAE config).
SD3_VAE_SCALING = 1.5305
SD3_VAE_SHIFT = 0.0609

# SD3.5 Medium's real transformer config (stabilityai/stable-diffusion-3.5-medium,
# transformer/config.json), for `random:sd35m` benchmarks at paper scale.
SD35M_TRANSFORMER_CONFIG = dict(
    sample_size=128,
    patch_size=2,
    in_channels=16,
    out_channels=16,
    num_layers=24,
    attention_head_dim=64,
    num_attention_heads=24,
    joint_attention_dim=4096,
    caption_projection_dim=1536,
    pooled_projection_dim=2048,
    pos_embed_max_size=384,
    dual_attention_layers=tuple(range(13)),
    qk_norm="rms_norm",
)

# SD3 / SD3.5's real VAE config (transformer's 16 latent channels, x8): `random:sd35m` decodes
# with it, so rollout benchmarks pay the real decode.
SD35M_VAE_CONFIG = dict(
    in_channels=3, out_channels=3, latent_channels=16,
    down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
    block_out_channels=(128, 256, 512, 512), layers_per_block=2, act_fn="silu",
    norm_num_groups=32, sample_size=1024, scaling_factor=SD3_VAE_SCALING,
    shift_factor=SD3_VAE_SHIFT, use_quant_conv=False, use_post_quant_conv=False,
)

TINY_TRANSFORMER_CONFIG = dict(
    sample_size=16,  # default 128 px images
    patch_size=2,
    in_channels=16,
    out_channels=16,
    num_layers=2,
    attention_head_dim=HEAD_DIM,
    num_attention_heads=HEADS,
    joint_attention_dim=T5_WIDTH,
    caption_projection_dim=HEADS * HEAD_DIM,
    pooled_projection_dim=2 * CLIP_PROJECTION,
    pos_embed_max_size=32,  # up to 512 px (64 latent / patch 2)
    dual_attention_layers=(0,),
    qk_norm="rms_norm",
)

_SUBJECTS = [
    "a red apple", "a blue car", "a small dog", "an old man", "a green tree", "a white cat",
    "a wooden chair", "a yellow flower", "a tall building", "a black horse", "two birds",
    "three cups of coffee", "a pink handbag", "a laptop", "a cow", "a pizza", "a robot",
    "a mountain lake", "a city skyline", "a neon sign", "a teddy bear", "an orange clock",
]
_SCENES = [
    "on a table", "in the park", "at sunset", "under the rain", "next to a window",
    "in a snowy forest", "on the beach", "in space", "left of a bench", "right of a vase",
]
_STYLES = [
    "a photo of", "a painting of", "a digital illustration of", "a close-up shot of",
    "a watercolor of", "a 3d render of",
]
_TEXTS = [
    'a sign that says "hello world"', 'a poster with the text "Spring Collection 2024"',
    'a cake reading "Forever Yours"', 'a screen displaying "Step Goal Achieved"',
    "The quick brown fox jumps over the lazy dog. 0123456789 !?.,:;'\"-()",
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ abcdefghijklmnopqrstuvwxyz @#$%&*+=/<>[]{}_~",
]


def tiny_corpus() -> list[str]:
    """A small deterministic prompt corpus to train the tiny tokenizers on."""
    lines = [f"{style} {subject} {scene}" for style in _STYLES for subject in _SUBJECTS
             for scene in _SCENES[: 1 + len(subject) % len(_SCENES)]]
    return lines + _TEXTS


def train_clip_tokenizer():
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import CLIPTokenizer

    # Mirror CLIPTokenizer's own normalizer / pre-tokenizer so the learned merges
    # apply unchanged when transformers rebuilds the tokenizer from vocab + merges.
    bpe = Tokenizer(models.BPE(end_of_word_suffix="</w>", continuing_subword_prefix=""))
    bpe.normalizer = normalizers.Sequence(
        [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()])
    clip_split = r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(clip_split), behavior="removed", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=CLIP_VOCAB_SIZE, initial_alphabet=alphabet, end_of_word_suffix="</w>",
        special_tokens=[], show_progress=False)
    bpe.train_from_iterator(tiny_corpus(), trainer=trainer)
    learned = bpe.get_vocab()
    # CLIP's layout: every byte, every byte + "</w>", then merges, then specials, so
    # any text (not just the corpus) tokenizes without unknown tokens.
    base = sorted(alphabet)
    tokens = base + [c + "</w>" for c in base]
    merges = _bpe_merges(bpe)
    tokens += ["".join(pair) for pair in merges]
    tokens += sorted(set(learned) - set(tokens))
    vocab: dict[str, int] = {}
    for tok in tokens + ["<|startoftext|>", "<|endoftext|>"]:
        vocab.setdefault(tok, len(vocab))
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=77)


def _bpe_merges(bpe) -> list[tuple[str, str]]:
    import json

    merges = json.loads(bpe.to_str())["model"]["merges"]
    # tokenizers serialises merges as [a, b] pairs (or "a b" strings in old versions).
    return [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in merges]


def train_t5_tokenizer():
    import sentencepiece as spm
    from transformers import T5Tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "t5")
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(tiny_corpus()), model_prefix=prefix, vocab_size=T5_VOCAB_SIZE,
            model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
            hard_vocab_limit=False,  # the corpus is too small for an exact vocab size
            character_coverage=1.0, num_threads=1, minloglevel=2)  # one thread: deterministic training
        sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
        pieces = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]
    return T5Tokenizer(vocab=pieces, extra_ids=0, model_max_length=512)


# Text-encoder widths (CLIP-L, CLIP-G, T5) of the tiny model and of SD3.5 Medium: the
# `random:sd35m` pipeline keeps shallow encoders but with the real widths, so prompt
# embeddings (4096 wide, pooled 2048) fit its full-size transformer.
TINY_TEXT_WIDTHS = (CLIP_HIDDEN, CLIP_HIDDEN, T5_WIDTH)
SD35M_TEXT_WIDTHS = (768, 1280, 4096)


def tiny_text_encoders(clip_tok, t5_tok, widths=TINY_TEXT_WIDTHS):
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    def clip(width):
        cfg = CLIPTextConfig(
            vocab_size=len(clip_tok), hidden_size=width, intermediate_size=64,
            num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=77,
            projection_dim=width, hidden_act="gelu",
            bos_token_id=clip_tok.bos_token_id, eos_token_id=clip_tok.eos_token_id,
            pad_token_id=clip_tok.pad_token_id)
        return CLIPTextModelWithProjection(cfg)

    t5_cfg = T5Config(
        vocab_size=len(t5_tok), d_model=widths[2], d_ff=64, d_kv=16, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1,
        decoder_start_token_id=0, feed_forward_proj="gated-gelu")
    return clip(widths[0]), clip(widths[1]), T5EncoderModel(t5_cfg)


TINY_VAE_CONFIG = dict(
    in_channels=3, out_channels=3, latent_channels=16,
    down_block_types=("DownEncoderBlock2D",) * 4,  # 3 downsamples: x8 like SD3
    up_block_types=("UpDecoderBlock2D",) * 4,
    # One norm group: with one group per channel the decoder's final GroupNorm pins
    # every channel's mean, so image brightness could not respond to the latents at
    # all (std 0.0007 over random latents); one group leaves it a range to learn in.
    block_out_channels=(8, 8, 16, 16), layers_per_block=1, norm_num_groups=1,
    scaling_factor=SD3_VAE_SCALING, shift_factor=SD3_VAE_SHIFT,
    use_quant_conv=False, use_post_quant_conv=False)


def _tiny_vae():
    from diffusers import AutoencoderKL

    return AutoencoderKL(**TINY_VAE_CONFIG)


def build_tiny_pipeline(seed: int = 0, text_widths=TINY_TEXT_WIDTHS):
    """The tiny SD3 pipeline, fully deterministic given `seed`, in fp32 on the CPU."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    clip_tok, t5_tok = train_clip_tokenizer(), train_t5_tokenizer()
    # Forked RNG: building a model must not perturb the caller's global torch stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        text_l, text_g, t5 = tiny_text_encoders(clip_tok, t5_tok, text_widths)
        transformer = SD3Transformer2DModel(**TINY_TRANSFORMER_CONFIG)
        vae = _tiny_vae()
    pipe = StableDiffusion3Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=vae,
        text_encoder=text_l, tokenizer=clip_tok, text_encoder_2=text_g, tokenizer_2=clip_tok,
        text_encoder_3=t5, tokenizer_3=t5_tok)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def save_tiny_pipeline(out_dir: str | os.PathLike, seed: int = 0) -> Path:
    """Build the tiny pipeline and `save_pretrained` it atomically into `out_dir`."""
    out = Path(out_dir).expanduser()
    pipe = build_tiny_pipeline(seed)
    with atomic_path(out) as tmp:
        pipe.save_pretrained(tmp, safe_serialization=True)
    return out


def folder_size_bytes(path: str | os.PathLike) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def parameter_count(pipe) -> int:
    total = 0
    for name in ("transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3"):
        module = getattr(pipe, name, None)
        if module is not None:
            total += sum(p.numel() for p in module.parameters())
    return total
