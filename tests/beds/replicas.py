"""Random-init replicas of the paper's assets, each in the file format its real loader reads.

Every writer is deterministic given its seed and takes well under a second (the SD3
pipeline a few seconds); widths are tiny. The layout follows the real repositories
(file names and formats), not transformers' current save format, so the loaders are
exercised on what a download really contains. The reward writers also take `size` (an
architecture: "tiny", or the real model's dims, e.g. "ViT-H-14") and `device` (where the
random init runs: a 1 B-parameter init on the CPU takes many seconds): the gpu check's
`score` phase (marble/tools/gpu_score.py) writes the scorers at their real size with them.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch

CLIP_PROJECTION = 16  # tiny CLIP embedding width (the aesthetic head's input)
CLIP_IMAGE = 32
BERT_HIDDEN = 32

# transformers CLIPConfig dims by architecture: the tiny replica's, and the hub configs' of
# openai/clip-vit-large-patch14 (CLIPScore, Aesthetic, GenEval's colours) and
# laion/CLIP-ViT-H-14-laion2B-s32B-b79K (= yuvalkirstain/PickScore_v1's).
_TINY_TOWER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
CLIP_ARCHS = {
    "tiny": {"text": _TINY_TOWER, "vision": {**_TINY_TOWER, "image_size": CLIP_IMAGE, "patch_size": 8},
             "projection_dim": CLIP_PROJECTION, "vocab_size": None, "hidden_act": None},
    "ViT-L-14": {"text": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12),
                 "vision": dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                                image_size=224, patch_size=14),
                 "projection_dim": 768, "vocab_size": 49408, "hidden_act": "quick_gelu"},
    "ViT-H-14": {"text": dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16),
                 "vision": dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=16,
                                image_size=224, patch_size=14),
                 "projection_dim": 1024, "vocab_size": 49408, "hidden_act": "gelu"},
}

# GenEval's evaluation/object_names.txt: COCO's 80 classes as GenEval's prompts name them.
GENEVAL_OBJECTS = (
    "person,bicycle,car,motorcycle,airplane,bus,train,truck,boat,traffic light,fire hydrant,stop sign,"
    "parking meter,bench,bird,cat,dog,horse,sheep,cow,elephant,bear,zebra,giraffe,backpack,umbrella,handbag,"
    "tie,suitcase,frisbee,skis,snowboard,sports ball,kite,baseball bat,baseball glove,skateboard,surfboard,"
    "tennis racket,bottle,wine glass,cup,fork,knife,spoon,bowl,banana,apple,sandwich,orange,broccoli,carrot,"
    "hot dog,pizza,donut,cake,chair,couch,potted plant,bed,dining table,toilet,tv,laptop,computer mouse,"
    "tv remote,computer keyboard,cell phone,microwave,oven,toaster,sink,refrigerator,book,clock,vase,"
    "scissors,teddy bear,hair drier,toothbrush"
).split(",")


def write_config_json(path: Path, obj) -> None:
    """A config file as the hub repos hold them (indented, sorted keys)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _bpe_files(folder: Path, tokenizer_json: dict, special: dict) -> None:
    """vocab.json + merges.txt + special_tokens_map.json (the hub's slow-tokenizer layout)."""
    model = tokenizer_json["model"]
    write_config_json(folder / "vocab.json", model["vocab"])
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(m + "\n" for m in merges), encoding="utf-8")
    write_config_json(folder / "special_tokens_map.json", special)


# ------------------------------------------------------------------ SD3.5 Medium


def _spiece_model(out: Path) -> None:
    """The sentencepiece model the tiny T5 tokenizer is built from (same corpus and options)."""
    import sentencepiece as spm

    from marble.models.tiny import T5_VOCAB_SIZE, tiny_corpus

    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "t5")
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(tiny_corpus()), model_prefix=prefix, vocab_size=T5_VOCAB_SIZE,
            model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1, hard_vocab_limit=False,
            character_coverage=1.0, num_threads=1, minloglevel=2)
        out.write_bytes(Path(prefix + ".model").read_bytes())


def _two_shards(folder: Path) -> None:
    """model.safetensors -> model-0000{1,2}-of-00002.safetensors + index (the real T5's layout)."""
    from safetensors.torch import load_file, save_file

    state = load_file(folder / "model.safetensors")
    keys = sorted(state)
    halves = [keys[: len(keys) // 2], keys[len(keys) // 2 :]]
    weight_map, total = {}, 0
    for i, part in enumerate(halves, 1):
        name = f"model-{i:05d}-of-00002.safetensors"
        save_file({k: state[k].contiguous() for k in part}, folder / name, metadata={"format": "pt"})
        weight_map.update({k: name for k in part})
        total += sum(state[k].numel() * state[k].element_size() for k in part)
    write_config_json(folder / "model.safetensors.index.json",
                      {"metadata": {"total_size": total}, "weight_map": weight_map})
    (folder / "model.safetensors").unlink()


def sd3_repo(folder: Path, seed: int = 0) -> None:
    from marble.models.tiny import build_tiny_pipeline

    pipe = build_tiny_pipeline(seed)
    pipe.save_pretrained(folder, safe_serialization=True)
    for name in ("tokenizer", "tokenizer_2"):
        sub = folder / name
        _bpe_files(sub, json.loads((sub / "tokenizer.json").read_text()), getattr(pipe, name).special_tokens_map)
        (sub / "tokenizer.json").unlink()  # the real repo has only the slow files here
    _spiece_model(folder / "tokenizer_3" / "spiece.model")
    write_config_json(folder / "tokenizer_3" / "special_tokens_map.json", pipe.tokenizer_3.special_tokens_map)
    _two_shards(folder / "text_encoder_3")


# ------------------------------------------------------------------ CLIP / BERT folders


# Tokenizer files are passed positionally: transformers 4 names the first arguments
# vocab_file / merges_file, transformers 5 vocab / merges and silently ignores vocab_file=
# (the saved tokenizer.json then holds only the special tokens and every word is [UNK]).


def _byte_chars() -> list[str]:
    """GPT-2/CLIP byte-to-unicode alphabet (256 printable stand-ins for bytes)."""
    keep = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
            + list(range(ord("®"), ord("ÿ") + 1)))
    chars, n = keep[:], 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return [chr(c) for c in chars]


def _init_on(device: str, seed: int):
    """The random init's RNG context: seeded, on `device` (its CPU or CUDA state restored after)."""
    import contextlib

    dev = torch.device(device)
    stack = contextlib.ExitStack()
    stack.enter_context(torch.random.fork_rng(devices=[] if dev.type == "cpu" else [dev.index or 0]))
    torch.manual_seed(seed)
    stack.enter_context(dev)
    return stack


def clip_repo(folder: Path, seed: int = 0, size: str = "tiny", device: str = "cpu") -> None:
    """CLIPModel + processor as on the hub: config.json, model.safetensors, preprocessor_config.json,
    vocab.json, merges.txt, tokenizer.json, tokenizer_config.json, special_tokens_map.json.
    `size`: a CLIP_ARCHS key (the tokenizer stays character-level: the real BPE merges are a
    download; its ids index the real-size embedding, prompts get one token a character)."""
    from transformers import CLIPImageProcessor, CLIPModel, CLIPTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    chars = _byte_chars()
    vocab = {t: i for i, t in enumerate(chars + [c + "</w>" for c in chars] + ["<|startoftext|>", "<|endoftext|>"])}
    write_config_json(folder / "vocab.json", vocab)
    (folder / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")  # character-level BPE
    tokenizer = CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"), model_max_length=77)
    tokenizer.save_pretrained(folder)
    write_config_json(folder / "special_tokens_map.json", tokenizer.special_tokens_map)
    side = CLIP_ARCHS[size]["vision"]["image_size"]
    image = CLIPImageProcessor(size={"shortest_edge": side}, crop_size={"height": side, "width": side})
    image.to_json_file(folder / "preprocessor_config.json")
    with _init_on(device, seed):
        CLIPModel(clip_config(size, len(vocab))).save_pretrained(folder)


def clip_config(size: str, tokenizer_len: int):
    """The CLIPConfig of a CLIP_ARCHS entry; bos / eos / pad are the replica tokenizer's last ids."""
    from transformers import CLIPConfig

    arch = CLIP_ARCHS[size]
    act = {"hidden_act": arch["hidden_act"]} if arch["hidden_act"] else {}
    special = dict(bos_token_id=tokenizer_len - 2, eos_token_id=tokenizer_len - 1, pad_token_id=tokenizer_len - 1)
    return CLIPConfig(
        text_config=dict(vocab_size=arch["vocab_size"] or tokenizer_len, **arch["text"], max_position_embeddings=77,
                         **special, **act),
        vision_config=dict(**arch["vision"], **act), projection_dim=arch["projection_dim"])


BERT_WORDS = ("[PAD] [UNK] [CLS] [SEP] [MASK] a an the of on in and with photo picture image dog cat red blue "
              "green car person tree sign text . , ! ? ' \" - 0 1 2 3 4 5 6 7 8 9").split()


def bert_vocab() -> list[str]:
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    return list(dict.fromkeys(BERT_WORDS + letters + ["##" + c for c in letters]))


def bert_repo(folder: Path) -> None:
    """bert-base-uncased's tokenizer files (vocab.txt, tokenizer.json, tokenizer_config.json) + a tiny config."""
    from transformers import BertConfig, BertTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    vocab = bert_vocab()
    (folder / "vocab.txt").write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    # Positional, as in clip_repo: transformers 5 ignores vocab_file=.
    BertTokenizer(str(folder / "vocab.txt"), do_lower_case=True).save_pretrained(folder)
    (folder / "vocab.txt").write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    BertConfig(vocab_size=len(vocab), hidden_size=BERT_HIDDEN, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=2).to_json_file(folder / "config.json")


# ------------------------------------------------------------------ reward checkpoints


def _mlp_head(input_dim: int, seed: int) -> dict[str, torch.Tensor]:
    from marble.rewards.clip_family import AestheticMLP

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AestheticMLP(input_dim).state_dict()


def aesthetic_head(path: Path, seed: int = 0, size: str = "tiny") -> None:
    """The LAION head's plain state dict (layers.{0,2,4,6,7}), on the `size` CLIP's embedding width."""
    torch.save(_mlp_head(CLIP_ARCHS[size]["projection_dim"], seed), path)


# BLIP's timm ViT (width, depth, patch, image side) and the BERT-MED text encoder of
# ImageReward: the one-block tiny replica's, and the real ViT-L/16 at 224 + bert-base.
IR_ARCHS = {
    "tiny": {"vision": dict(width=64, depth=1, patch=16, image=CLIP_IMAGE),  # one 64-dim head, as BLIP's
             "text": dict(hidden_size=BERT_HIDDEN, intermediate_size=64, num_attention_heads=2, num_hidden_layers=2,
                          vocab_size=len(bert_vocab()) + 2),
             "init": 0.2},
    "ViT-L-16": {"vision": dict(width=1024, depth=24, patch=16, image=224),
                 "text": dict(hidden_size=768, intermediate_size=3072, num_attention_heads=12, num_hidden_layers=12,
                              vocab_size=30524),  # bert-base-uncased's 30522 + BLIP's [DEC], [ENC]
                 "init": 0.02},  # BERT's initializer_range: 0.2 overflows nothing, but saturates 24 layers
}


def med_config(size: str = "tiny") -> dict:
    """BLIP's med_config.json (a BertConfig plus `encoder_width`, cross-attention on) of `size`."""
    arch = IR_ARCHS[size]
    return {"architectures": ["BertModel"], "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
            "hidden_dropout_prob": 0.1, "initializer_range": 0.02, "layer_norm_eps": 1e-12,
            "max_position_embeddings": 512, "model_type": "bert", "pad_token_id": 0, "type_vocab_size": 2,
            **arch["text"], "encoder_width": arch["vision"]["width"], "add_cross_attention": True}


def imagereward_state(cfg: dict, seed: int = 0, size: str = "tiny", device: str = "cpu") -> dict[str, torch.Tensor]:
    """ImageReward.pt's keys (image-reward's module names: BLIP's timm ViT under
    `blip.visual_encoder.`, BERT-MED with cross-attention under `blip.text_encoder.`, the
    `mlp.layers.*` head), random (drawn on `device`, returned on the CPU), shaped by `cfg`
    (med_config) and the `size` ViT of IR_ARCHS."""
    g = torch.Generator(device).manual_seed(seed)
    vis, init = IR_ARCHS[size]["vision"], IR_ARCHS[size]["init"]
    vw, hid, inter = vis["width"], cfg["hidden_size"], cfg["intermediate_size"]

    def r(*shape, scale=init):
        return torch.randn(*shape, generator=g, device=device) * scale

    def norm(prefix, dim):
        return {f"{prefix}.weight": 1 + r(dim, scale=0.05), f"{prefix}.bias": r(dim, scale=0.05)}

    def linear(prefix, n_out, n_in):
        return {f"{prefix}.weight": r(n_out, n_in), f"{prefix}.bias": r(n_out, scale=0.05)}

    v, t = "blip.visual_encoder", "blip.text_encoder"
    s = {f"{v}.cls_token": r(1, 1, vw), f"{v}.pos_embed": r(1, (vis["image"] // vis["patch"]) ** 2 + 1, vw),
         f"{v}.patch_embed.proj.weight": r(vw, 3, vis["patch"], vis["patch"], scale=0.02),
         f"{v}.patch_embed.proj.bias": r(vw, scale=0.05), **norm(f"{v}.norm", vw)}
    for i in range(vis["depth"]):
        b = f"{v}.blocks.{i}"
        s |= {**norm(f"{b}.norm1", vw), **linear(f"{b}.attn.qkv", 3 * vw, vw), **linear(f"{b}.attn.proj", vw, vw),
              **norm(f"{b}.norm2", vw), **linear(f"{b}.mlp.fc1", 4 * vw, vw), **linear(f"{b}.mlp.fc2", vw, 4 * vw)}
    s |= {f"{t}.embeddings.word_embeddings.weight": r(cfg["vocab_size"], hid),
          f"{t}.embeddings.position_embeddings.weight": r(cfg["max_position_embeddings"], hid),
          f"{t}.embeddings.position_ids": torch.arange(cfg["max_position_embeddings"], device=device)[None],
          **norm(f"{t}.embeddings.LayerNorm", hid)}
    for i in range(cfg["num_hidden_layers"]):
        b = f"{t}.encoder.layer.{i}"
        for kind, kv_in in (("attention", hid), ("crossattention", vw)):
            s |= {**linear(f"{b}.{kind}.self.query", hid, hid), **linear(f"{b}.{kind}.self.key", hid, kv_in),
                  **linear(f"{b}.{kind}.self.value", hid, kv_in), **linear(f"{b}.{kind}.output.dense", hid, hid),
                  **norm(f"{b}.{kind}.output.LayerNorm", hid)}
        s |= {**linear(f"{b}.intermediate.dense", inter, hid), **linear(f"{b}.output.dense", hid, inter),
              **norm(f"{b}.output.LayerNorm", hid)}
    s |= {**linear("blip.vision_proj", 16, vw), **linear("blip.text_proj", 16, hid)}  # saved, unused by the score
    for idx, (n_out, n_in) in zip((0, 2, 4, 6, 7), ((1024, hid), (128, 1024), (64, 128), (16, 64), (1, 16))):
        s |= linear(f"mlp.layers.{idx}", n_out, n_in)
    return {k: x.cpu() for k, x in s.items()}


def imagereward_repo(folder: Path, seed: int = 0, size: str = "tiny", device: str = "cpu") -> None:
    """med_config.json + ImageReward.pt (a plain state dict in image-reward's names, the whole
    model: ViT, BERT-MED with cross-attention, head), read by marble/rewards/blip.py."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg = med_config(size)
    write_config_json(folder / "med_config.json", cfg)
    torch.save(imagereward_state(cfg, seed, size, device), folder / "ImageReward.pt")


def detector_ckpt(path: Path, seed: int = 0) -> None:
    """An mmdet-style checkpoint container ({meta, state_dict}); a format stand-in only (a tiny
    random Mask2Former needs mmdet, see `make test-geneval-mmdet` in issue 9)."""
    g = torch.Generator().manual_seed(seed)
    torch.save({"meta": {"CLASSES": GENEVAL_OBJECTS, "mmdet_version": "2.28.2"},
                "state_dict": {"panoptic_head.cls_embed.weight":
                               torch.randn(len(GENEVAL_OBJECTS) + 1, 16, generator=g)}},
               path)


def object_names(path: Path) -> None:
    path.write_text("\n".join(GENEVAL_OBJECTS) + "\n", encoding="utf-8")


def prompt_files(raw: Path, seed: int = 0) -> None:
    """pickscore/ocr train+test, geneval train/test metadata, drawbench test (marble.data.tiny_prompts)."""
    from marble.data.tiny_prompts import write_tiny_raw

    write_tiny_raw(raw, seed=seed, n_train=24, n_test=8)


def paddle_model_tar(path: Path, name: str, seed: int = 0) -> None:
    """A PaddleOCR model tar in its real layout (`<name>/inference.pdmodel`, `.pdiparams`,
    `.pdiparams.info`), random bytes inside: what marble.rewards.paddle_models extracts (no
    Paddle here to run it; paper-mini scores OCR with an ONNX engine)."""
    import io
    import tarfile

    g = torch.Generator().manual_seed(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for suffix in ("pdmodel", "pdiparams", "pdiparams.info"):
            data = bytes(torch.randint(0, 256, (256,), generator=g, dtype=torch.uint8).tolist())
            info = tarfile.TarInfo(f"{name}/inference.{suffix}")
            info.size, info.mtime = len(data), 0  # fixed mtime: the same bytes every build
            tar.addfile(info, io.BytesIO(data))


def sd3_peft_lora_repo(folder: Path, seed: int = 0, rank: int = 4) -> None:
    """A hub LoRA for the tiny SD3 replica as the FlowGRPO repos hold one: peft's
    `adapter_config.json` + `adapter_model.safetensors` (keys `base_model.model.<module>.lora_{A,B}.weight`,
    no adapter name), targeting the reference's attention projections. B is random (not
    peft's zeros), so the LoRA changes the images it is evaluated on."""
    from diffusers import SD3Transformer2DModel
    from peft import LoraConfig
    from safetensors.torch import save_file

    from marble.config import SD3_LORA_TARGETS
    from marble.models.lora import PEFT_CONFIG_FILE, PEFT_WEIGHTS_FILE, TRAINABLE, adapter_state, lora_config_dict
    from marble.models.tiny import TINY_TRANSFORMER_CONFIG

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = SD3Transformer2DModel(**TINY_TRANSFORMER_CONFIG)
        transformer.add_adapter(LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(SD3_LORA_TARGETS),
                                           init_lora_weights="gaussian"), adapter_name=TRAINABLE)
        state = {f"base_model.model.{k}": (torch.randn_like(v) * 0.05 if ".lora_B." in k else v).contiguous()
                 for k, v in adapter_state(transformer, TRAINABLE).items()}
    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, str(folder / PEFT_WEIGHTS_FILE), metadata={"format": "pt"})
    write_config_json(folder / PEFT_CONFIG_FILE, lora_config_dict(transformer, TRAINABLE))
