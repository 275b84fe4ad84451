"""The gpu check's `score` phase: each paper reward's real scorer class at its real size, random weights.

For every reward of the paper (the training five, then the evaluation-only two) it writes a
random-init replica of the scorer's checkpoint in the real on-disk format at the REAL
architecture (the test beds' tests/beds/replicas.py, package `beds`, with `size`: CLIP ViT-H/14 for PickScore, ViT-L/14
for CLIPScore and the aesthetic head, BLIP ViT-L/16 + BERT-base for ImageReward, open_clip's
ViT-H-14 for HPSv2.1, mmdet's own Mask2Former Swin-S config for GenEval) into a temporary
folder under the work folder (~11 GB; the random init runs on the GPU), builds the real class
from it with the registry's one builder (`build_scorers`, as training and evaluation do) on
the GPU, and calls it as training does, `reward(images, prompts, metadata)`, on one
paper-shaped batch: `sampling.batch_size` images at `sampling.resolution` of the sd35m
geometry (9 at 512 px; smooth random images on the CPU, as decoded rollouts arrive), with
the first prompts of the gpu check's prompt table that the reward applies to (a real
per-GPU batch holds one or two prompts of one source, so every row of it applies).

Numerics as `marble train` / `marble evaluate` score: fp32 weights, TF32 on, no autocast
(evaluation autocasts only the pipeline call; training scores in its own threads, where the
rollout's autocast does not reach). Per scorer: write_s (the replica files: not part of a
run), build_s (the real constructor: what a run pays at start), first_call_s (warm-up),
score_s (warm, synchronised), resident_gb (weights and caches), peak allocated / reserved
memory, device, dtype, engine, and the NaN count. A scorer whose stack does not import is
`skipped` with the reason (hpsv2: open_clip; geneval: mmdet 2.x; ocr: an ONNX engine and
Levenshtein); one that fails is `error` and the others still run. The JSON is rewritten
after each scorer, so a timed-out phase keeps what it measured. `tiny`: tiny replicas,
3 images at 32 px, the CPU.
"""

from __future__ import annotations

import gc
import importlib
import json
import tempfile
import time
from pathlib import Path

import torch

from marble.rewards import descriptor, descriptors

# Every reward with a replica writer (its descriptor's `replica`): the paper's training rewards
# first, then evaluation's: a timeout loses the last ones.
PAPER_REWARDS = tuple(d.name for d in sorted((d for d in descriptors() if d.replica),
                                             key=lambda d: not d.trained))
ONNX_OCR = ("rapidocr_onnxruntime", "rapidocr")  # resolve_backend's order, paddle left out
SEED = 0


class Skipped(Exception):
    """The scorer's stack does not import here; the message says which and why."""


def importable(module: str) -> str | None:
    """None when `module` imports, else the reason (binary wheels fail past find_spec)."""
    try:
        importlib.import_module(module)
    except Exception as exc:  # any import failure is a reason to skip, named
        return f"{type(exc).__name__}: {exc}"
    return None


class Replicas:
    """Writes each scorer's replica once, at `size`, into `root`; the seconds per reward."""

    def __init__(self, root: Path, tiny: bool, device: str):
        self.root, self.tiny, self.device = root, tiny, device
        self.write_s: dict[str, float] = {}

    def size(self, reward: str) -> str:
        # The real architecture (its descriptor's `replica_size`); --tiny uses "tiny" for all.
        return "tiny" if self.tiny else descriptor(reward).replica_size

    def _once(self, reward: str, folder: Path, write) -> Path:
        if not folder.exists():  # CLIP ViT-L/14 serves clipscore, aesthetic and geneval
            start = time.perf_counter()
            write(folder)
            self.write_s[reward] = self.write_s.get(reward, 0.0) + time.perf_counter() - start
        return folder

    def clip(self, reward: str) -> str:
        # The replicas are test beds (tests/beds, not shipped): the gpu check runs from a checkout
        # with tests/ on PYTHONPATH (`make gpu-check`), so `beds` is imported only here, lazily.
        from beds.replicas import clip_repo

        size = self.size(reward)
        return str(self._once(reward, self.root / f"clip-{size}",
                              lambda d: clip_repo(d, SEED, size, self.device)))

    def options(self, reward: str) -> dict:
        """The real class's options pointing at the replica (raises Skipped)."""
        from beds import replicas

        kind = descriptor(reward).replica
        if kind == "clip":
            return {"model": self.clip(reward)}
        if kind == "aesthetic_head":
            model = self.clip(reward)
            head = self._once(reward, self.root / f"{reward}.pth",
                              lambda p: replicas.aesthetic_head(p, SEED, self.size(reward)))
            return {"model": model, "head": str(head)}
        if kind == "blip":
            def write(d):
                replicas.imagereward_repo(d, SEED, self.size(reward), self.device)
                replicas.bert_repo(d / "bert-base-uncased")  # the tokenizer (its ids fit any vocab)
            return {"ckpt_dir": str(self._once(reward, self.root / reward, write))}
        if kind == "open_clip":
            return self._hps(reward)
        if kind == "mask2former":
            return self._geneval(reward)
        if kind == "onnx_ocr":
            return self._ocr()
        raise KeyError(f"gpu check score phase: no replica writer {kind!r} for reward {reward!r}")

    def _hps(self, reward: str) -> dict:
        from beds import replicas_hps
        from beds.mirror import HPS_ARCH, replica_reward_options

        if (why := importable("open_clip")) is not None:
            raise Skipped(f"HPSv2.1 needs open_clip (carry open_clip_torch, ftfy, wcwidth, timm as "
                          f"wheels, docs/gpu_check.md): {why}")
        size = self.size(reward)

        def write(d):
            replicas_hps.hps_repo(d, SEED, size, self.device)
            replicas_hps.write_hps_config(d / f"{HPS_ARCH}.json")

        folder = self._once(reward, self.root / reward, write)
        # The real size is open_clip's built-in ViT-H-14, the reward's default `arch`.
        extra = replica_reward_options(folder)[reward] if self.tiny else {}
        return {"ckpt_dir": str(folder), **extra}

    def _geneval(self, reward: str) -> dict:
        if (why := importable("mmdet")) is not None:
            raise Skipped(f"GenEval's Mask2Former needs mmdet 2.x on a compiled mmcv-full 1.x "
                          f"(docs/rewards.md): {why}")
        from marble.rewards.geneval import DETECTOR_CONFIG, mmdet_config_path
        from beds import mmdet_replica

        folder = self.root / reward
        # Tiny: the config inheriting the real one with small widths; real: the Swin-S config itself.
        config = folder / mmdet_replica.CONFIG_NAME if self.tiny else mmdet_config_path(DETECTOR_CONFIG)

        def write(d):
            if self.tiny:
                mmdet_replica.write_config(config)
            mmdet_replica.write_checkpoint(config, d / mmdet_replica.CKPT_NAME, SEED)

        self._once(reward, folder, write)
        return {"detector_config": str(config), "detector_ckpt": str(folder / mmdet_replica.CKPT_NAME),
                "clip_model": self.clip(reward)}

    @staticmethod
    def _ocr() -> dict:
        reasons = {m: importable(m) for m in ONNX_OCR}
        backend = next((m for m, why in reasons.items() if why is None), None)
        if backend is None or (why := importable("Levenshtein")) is not None:
            missing = reasons if backend is None else {"Levenshtein": why}
            raise Skipped("OCR's ONNX engine needs rapidocr (or rapidocr_onnxruntime, with onnxruntime) and "
                          f"Levenshtein: {'; '.join(f'{m}: {r}' for m, r in missing.items())}")
        return {"backend": backend}  # the paper's PaddleOCR is not carried: an ONNX stand-in


def paper_batch(tiny: bool) -> torch.Tensor:
    """[B, 3, R, R] in [0, 1] on the CPU: the sd35m rollout batch and resolution (tiny: 3 at
    32 px, the gpu check's tiny bench; an ONNX OCR call costs ~0.5 s an image whatever its
    size); smooth random colour fields (upsampled 16 x 16 noise), not pixel noise an OCR
    detector would read as a page of text."""
    from marble.config import load_config

    s = load_config("sd35m").sampling
    n, side = (3, 32) if tiny else (s.batch_size, s.resolution)
    coarse = torch.rand(n, 3, 16, 16, generator=torch.Generator().manual_seed(SEED))
    return torch.nn.functional.interpolate(coarse, size=(side, side), mode="bilinear", align_corners=False)


def batch_prompts(table: Path, reward, n: int) -> tuple[list[str], list[dict]]:
    """The first `n` rows of the prompt table that `reward` applies to (cycled if fewer)."""
    import pandas as pd

    df = pd.read_parquet(table)
    rows = [(p, json.loads(m) if isinstance(m, str) else dict(m or {}))
            for p, m in zip(df["prompt"], df["metadata"])]
    rows = [r for r in rows if reward.applies(*r)]
    if not rows:
        raise ValueError(f"{table}: no prompt that reward {reward.name!r} applies to")
    rows = [rows[i % len(rows)] for i in range(n)]
    return [p for p, _ in rows], [m for _, m in rows]


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _gb(n_bytes: int) -> float:
    return n_bytes / 2**30


def _dtypes(reward) -> list[str]:
    """The parameter dtypes of the torch modules the scorer holds (one level down too:
    GenEval's detector and colour classifier hold theirs); [] for an ONNX engine."""
    seen, found = set(), set()
    stack = [(v, 1) for v in vars(reward).values()]
    while stack:
        obj, depth = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.nn.Module):
            found |= {str(p.dtype).removeprefix("torch.") for p in obj.parameters()}
        elif depth and hasattr(obj, "__dict__") and not isinstance(obj, type):
            stack += [(v, depth - 1) for v in vars(obj).values()]
    return sorted(found)


def measure(name: str, options: dict, images: torch.Tensor, table: Path, device: str) -> dict:
    """Build `name` through the registry on `device`, score one batch twice; the figures."""
    from marble.config import RewardSpec
    from marble.evaluation.runner import describe_scorers
    from marble.rewards import build_scorers

    cuda = torch.device(device).type == "cuda"
    _sync(device)
    if cuda:  # the replica writer's GPU init, freed and uncached: not this scorer's reserve
        gc.collect()
        torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated() if cuda else 0
    start = time.perf_counter()
    reward = build_scorers([RewardSpec(name=name, options=options)], device)[name]
    _sync(device)
    out = {"status": "ok", "build_s": time.perf_counter() - start, **describe_scorers({name: reward})[name]}
    out["device"] = out["device"] or "cpu"  # the OCR engines take no device: ONNX on the CPU
    out["dtype"] = _dtypes(reward)
    prompts, metadata = batch_prompts(table, reward, len(images))
    start = time.perf_counter()
    reward(images, prompts, metadata)  # warm-up: lazy loads (GenEval), kernels, allocator
    _sync(device)
    out["first_call_s"] = time.perf_counter() - start
    if cuda:  # what the scorer keeps allocated: weights (GenEval's load on its first call), caches
        out["resident_gb"] = _gb(torch.cuda.memory_allocated() - base)
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    scores = reward(images, prompts, metadata)
    _sync(device)
    out["score_s"] = time.perf_counter() - start
    if cuda:
        out["peak_allocated_gb"] = _gb(torch.cuda.max_memory_allocated())
        out["peak_reserved_gb"] = _gb(torch.cuda.max_memory_reserved())
    out.update(batch=len(scores), nan=int(torch.isnan(scores).sum()), scores=[float(x) for x in scores])
    del reward
    return out


def score_phase(table: Path, work: Path, tiny: bool, out: Path | None = None) -> dict:
    """Every reward of PAPER_REWARDS measured in turn (see the module docstring)."""
    from marble.runtime.io import write_text
    from marble.runtime.precision import enable_tf32

    from marble.rewards import reward_device

    # `train.reward_device` / `--reward_device cuda` on rank 0; the tiny check stays on the CPU.
    device = "cpu" if tiny else reward_device("cuda", local_rank=0)
    enable_tf32(torch.device(device), True)  # as training (model.allow_tf32) and evaluation set it
    images, cuda = paper_batch(tiny), torch.device(device).type == "cuda"
    result: dict = {"batch": list(images.shape), "device": device, "autocast": None,
                    "tf32": bool(torch.backends.cuda.matmul.allow_tf32) if cuda else None,
                    "memory_kind": "torch.cuda max_memory_allocated/reserved" if cuda else None,
                    "scorers": {}}
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="score-replicas-", dir=work) as tmp:
        reps = Replicas(Path(tmp), tiny, device)
        for name in PAPER_REWARDS:
            try:
                entry = measure(name, reps.options(name), images, table, device)
            except Skipped as why:
                entry = {"status": "skipped", "reason": str(why)}
            except Exception as exc:  # one scorer's failure must not hide the others' figures
                entry = {"status": "error", "error": f"{type(exc).__name__}: {str(exc)[-2000:]}"}
            entry["write_s"] = reps.write_s.get(name, 0.0)
            result["scorers"][name] = entry
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()  # each scorer's peak on its own
            if out is not None:  # after each scorer: a timeout keeps the finished ones
                write_text(out, json.dumps(result, indent=2) + "\n")
    return result
