"""One descriptor per reward: everything the rest of marble knows about a reward, by its name.

Torch-free (the workflow reads it while Snakemake builds its DAG). A new reward is its scorer
module plus one `RewardDescriptor` passed to `marble.rewards.register` (docs/ARCHITECTURE.md,
"Add a reward"); the doctor, the cost model, evaluation's defaults, Table 1's columns, the GPU
scorer check and the dev mirror read these fields, and no other module keys a table by a
reward's name (tests/test_one_definition.py counts them).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Column:
    """The reward's column of Table 1 (marble.evaluation.summary)."""

    label: str  # the header
    position: int  # its place among the columns, left to right
    keys: tuple[str, ...]  # result keys it reads, first present wins
    datasets: tuple[str, ...]  # benchmark prompt sets it reads, in order of preference
    scale: float = 1.0  # the paper prints score x scale
    places: int = 2  # decimals
    model_based: bool = False  # scored on both prompt sets; Table 1 takes eval.table1_prompts'


@dataclass(frozen=True)
class RewardDescriptor:
    """A reward: how to build it, what it needs, what it costs, where it is reported."""

    name: str
    target: str  # "module:Class", imported only when the reward is built
    # Estimated FLOPs per scored image (the GPU-hour plan). Required: an unknown cost is never 0.
    flops: float
    modules: tuple[str, ...] = ()  # import names its scorer needs beyond torch (the doctor)
    extra: str = "core"  # the install extra / environment that provides them
    light_options: tuple[tuple[str, object], ...] = ()  # (key, value) under which `modules` are not needed
    doctor_rows: tuple[str, ...] = ()  # the doctor's extra checks for it (marble.doctor's names)
    eval_datasets: tuple[str, ...] = ()  # benchmark datasets the reference evaluation scores with it
    column: Column | None = None  # its Table 1 column
    trained: bool = False  # one of the paper's training rewards (the GPU check measures these first)
    replica: str | None = None  # the dev replica writer of its checkpoint (marble.tools.gpu_score)
    replica_size: str | None = None  # the real architecture that replica is written at
    judge: bool = False  # scored by a served judge the workflow can start (eval.<name>.server)


_G = 1e9
# CLIP towers: 2 x parameters x tokens (parameter counts of the published architectures; an
# estimate until measured). ViT-H/14: vision 632 M x 257 tokens, text 354 M x 77.
_VIT_H = 2 * (0.632 * _G * 257 + 0.354 * _G * 77)
# ViT-L/14: vision 304 M x 257, text 123 M x 77; its vision tower alone.
_VIT_L = 2 * (0.304 * _G * 257 + 0.123 * _G * 77)
_VIT_L_VISION = 2 * 0.304 * _G * 257
# The UnifiedReward judge (UnifiedReward-7b-v1.5: LLaVA-OneVision, Qwen2-7B + SigLIP-so400m):
# per judged image, SigLIP on 5 crops of 729 tokens (anyres, 512 px) and the 7.6 B LLM over
# ~3,650 image + ~200 prompt + ~250 generated tokens. sglang's own efficiency is not
# modelled: the largest uncertain term of a judged evaluation.
JUDGE_TOKENS = 3650 + 200 + 250
_JUDGE = 2 * (0.4 * _G * 729 * 5 + 7.6 * _G * JUDGE_TOKENS)
_CLIP = ("transformers",)
_SIX = ("pickscore", "drawbench")  # MARBLE's evaluation.py scores the model-based rewards on both

# In the reference evaluation's order of scoring (evaluation.DEFAULT_REWARDS keeps it).
PAPER: tuple[RewardDescriptor, ...] = (
    RewardDescriptor("geneval", "marble.rewards.geneval:GenEvalReward",
                     # Mask2Former Swin-S at 1333 px (~0.3 TFLOP) + a CLIP ViT-L/14 colour pass per object (~3).
                     flops=0.3e12 + 3 * _VIT_L_VISION,
                     modules=("mmdet", "mmcv", "torchvision", "pycocotools"), extra="geneval (mmcv-full)",
                     light_options=(("detector", "stub"),), doctor_rows=("mmcv",), eval_datasets=("geneval",),
                     column=Column("GenEval", 0, ("geneval_overall", "accuracy", "geneval"), ("geneval",)),
                     trained=True, replica="mask2former", replica_size="ViT-L-14"),
    RewardDescriptor("ocr", "marble.rewards.ocr:OCRReward",
                     flops=0.02e12,  # PP-OCRv4 detection + recognition: a few GFLOPs
                     modules=("Levenshtein",), extra="ocr", doctor_rows=("ocr_engine",), eval_datasets=("ocr",),
                     column=Column("OCR", 1, ("ocr",), ("ocr",)), trained=True, replica="onnx_ocr"),
    RewardDescriptor("imagereward", "marble.rewards.imagereward:ImageRewardScorer",
                     # BLIP ViT-L/16 at 224 px (197 tokens) + BERT-base with cross-attention (~140 M x 35).
                     flops=2 * (0.304 * _G * 197 + 0.140 * _G * 35),
                     modules=_CLIP, eval_datasets=_SIX,
                     column=Column("ImgRwd", 6, ("imagereward",), _SIX, model_based=True),
                     replica="blip", replica_size="ViT-L-16"),
    RewardDescriptor("pickscore", "marble.rewards.clip_family:PickScore", flops=_VIT_H,
                     modules=_CLIP, eval_datasets=_SIX,
                     column=Column("PickScore", 2, ("pickscore",), _SIX, scale=26.0, model_based=True),
                     trained=True, replica="clip", replica_size="ViT-H-14"),
    RewardDescriptor("aesthetic", "marble.rewards.clip_family:Aesthetic", flops=_VIT_L_VISION,
                     modules=_CLIP, eval_datasets=_SIX,
                     column=Column("Aesthetic", 5, ("aesthetic",), _SIX, model_based=True),
                     replica="aesthetic_head", replica_size="ViT-L-14"),
    RewardDescriptor("clipscore", "marble.rewards.clip_family:ClipScore", flops=_VIT_L,
                     modules=_CLIP, eval_datasets=_SIX,
                     column=Column("CLIPScore", 3, ("clipscore",), _SIX, places=3, model_based=True),
                     trained=True, replica="clip", replica_size="ViT-L-14"),
    RewardDescriptor("hpsv2", "marble.rewards.hpsv2:HPSv2", flops=_VIT_H,
                     modules=("open_clip", "torchvision"), extra="clip", eval_datasets=_SIX,
                     column=Column("HPSv2.1", 4, ("hpsv2",), _SIX, places=3, model_based=True),
                     trained=True, replica="open_clip", replica_size="ViT-H-14"),
    # MARBLE's evaluation.py: the pickscore prompt set drops the judge, drawbench keeps it.
    RewardDescriptor("unifiedreward", "marble.rewards.unifiedreward:UnifiedReward", flops=_JUDGE,
                     modules=("httpx",), extra="sglang", doctor_rows=("judge",), eval_datasets=("drawbench",),
                     column=Column("UniRwd", 7, ("unifiedreward",), ("drawbench", "pickscore"), scale=5.0),
                     judge=True),
)

# The tiny preset's pixel statistics: CPU arithmetic, no FLOPs worth pricing (0 stated, not defaulted).
TOY: tuple[RewardDescriptor, ...] = (
    RewardDescriptor("toy_brightness", "marble.rewards.toy:ToyBrightness", flops=0.0, doctor_rows=("build",)),
    RewardDescriptor("toy_saturation", "marble.rewards.toy:ToySaturation", flops=0.0, doctor_rows=("build",)),
    RewardDescriptor("toy_color_match", "marble.rewards.toy:ToyColorMatch", flops=0.0, doctor_rows=("build",)),
    RewardDescriptor("toy_text_contrast", "marble.rewards.toy:ToyTextContrast", flops=0.0, doctor_rows=("build",)),
    # the claim's specialist for (b): a layout the generalists neither help nor oppose
    RewardDescriptor("toy_left_bright", "marble.rewards.toy:ToyLeftBright", flops=0.0, doctor_rows=("build",)),
    # its successor after the pilot: a colour shift the model learns, not opposed by the generalists
    RewardDescriptor("toy_warmth", "marble.rewards.toy:ToyWarmth", flops=0.0, doctor_rows=("build",)),
    # the claim's no-conflict control: toy_brightness under a second name (docs/claim.md)
    RewardDescriptor("toy_brightness_copy", "marble.rewards.toy:ToyBrightnessCopy", flops=0.0,
                     doctor_rows=("build",)),
    RewardDescriptor("toy_brightness_copy2", "marble.rewards.toy:ToyBrightnessCopy2", flops=0.0,
                     doctor_rows=("build",)),
    RewardDescriptor("toy_brightness_copy3", "marble.rewards.toy:ToyBrightnessCopy3", flops=0.0,
                     doctor_rows=("build",)),
)
