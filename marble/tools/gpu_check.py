"""`make gpu-check`: the paper path on one bare GPU machine in <= 8 minutes; one JSON.

    python -m marble.tools.gpu_check [--out FILE] [--work DIR]      # one GPU (<= 8 min on an H200)
    python -m marble.tools.gpu_check --tiny                         # CPU plumbing check (CI)

No venv and no registry: it runs on the machine's own `python3` (torch 2.11 CUDA, peft,
transformers, ...) with the pure-Python packages it lacks carried as wheels in `.whl/`
(see docs/gpu_check.md: `pip download` them here, `pip install --no-index --no-deps
--target .whl/site` there; `make gpu-check` does the install and sets PYTHONPATH).

Phases, each with its own timeout (PHASE_TIMEOUTS, 480 s in all), each in a fresh process
on the GPU (clean peak-memory counters); a failed or timed-out phase is recorded with its
error and the others still run:
- env: torch / CUDA / package versions, and which needed modules do not import.
- bench_fp32_base / bench_fp16_base: `marble bench step --preset bench_sd35m` under fp16
  autocast (+GradScaler) over fp32 base weights (the reference) and fp16 ones
  (`model.base_dtype: fp16`): weighted_sum / marble / mgda step time, allocated AND
  reserved peak memory, the optimizer step included.
- rollout: one rollout batch (25 dpm2 steps, batch 9, 512 px, decode with the real-size
  SD3 VAE) with the embedding cache vs encoding.
- profile: device syncs (`torch.cuda.set_sync_debug_mode`) of an amortized micro-step and
  a full solve, and the GPU-busy fraction from the profiler (`marble.tools.gpu_profile`).
- score: each paper reward's real scorer class (pickscore, clipscore, hpsv2, ocr, geneval,
  imagereward, aesthetic) built from random-init replicas at the REAL architecture in the
  real file formats, scoring one rollout batch (9 x 512 px) on the GPU as training does:
  build / warm score time, allocated and reserved peaks, dtype, engine, NaN count; those
  whose stack does not import (open_clip, mmdet, an ONNX OCR engine) are skipped with the
  reason (`marble.tools.gpu_score`).
- train_resume: a 3-step run of the `rho_07` code path (full solve at step 0, amortized
  after; fp16 + GradScaler over fp32 base weights) on a random-init SD3.5 Medium with toy
  rewards, then its resume from step 2, compared with the straight run on EVERY file of
  the final checkpoint (adapters, optimizer, state, the EMA `lora/` evaluation loads).
`--tiny` swaps in the tiny model, 32 px and the CPU, in this process (plumbing only).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path



def toy_rewards() -> list[str]:
    """The tiny preset's rewards (the toy scorers: no download), read from the preset, not a
    second list of the names."""
    from marble.config import load_config

    return [r.name for r in load_config(preset="tiny").rewards]


# Seconds per phase; they add up to the 8-minute budget (a test checks the sum). The score
# phase's 80 s (an estimate: ~11 GB of replicas written and loaded, open_clip's and BLIP's CPU
# inits in the real loaders) came from the phases with the most slack by reading: the two
# benches (3 rows x 3 micro-steps on a model built on the GPU: -25, -20), train (-20) and
# resume (-10, one step), profile (-5). Re-split them from the first GPU run's wall_s.
PHASE_TIMEOUTS = {"env": 15, "bench_fp32_base": 70, "bench_fp16_base": 60, "rollout": 60,
                  "profile": 45, "score": 80, "train": 100, "resume": 50}
BUDGET_S = 480
BENCH_ROWS = "weighted_sum,marble,mgda"
# Modules the phases import beyond torch: missing ones are named in the env phase.
NEEDED = ("diffusers", "transformers", "peft", "accelerate", "safetensors", "pandas",
          "pyarrow", "scipy", "yaml", "jsonschema", "tqdm", "numpy", "PIL")


def _run(module: str, argv: list[str], tiny: bool, timeout: float) -> None:
    """`python -m module argv`: a fresh process on the GPU (clean peak-memory counters);
    in this process for --tiny (plumbing only). Its stdout goes to stderr: ours is the JSON."""
    if tiny:
        import importlib

        with contextlib.redirect_stdout(sys.stderr):
            rc = importlib.import_module(module).main(argv)
        if rc != 0:
            raise RuntimeError(f"{module} {' '.join(argv[:4])} ... returned {rc}")
        return
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-m", module, *argv], stdout=sys.stderr,
                          stderr=subprocess.PIPE, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{module} {' '.join(argv[:4])} ... failed ({proc.returncode}):\n"
                           f"{proc.stderr[-4000:]}")


def env_info() -> dict:
    import importlib

    import torch

    versions, missing = {}, {}
    for name in NEEDED:
        try:
            versions[name] = getattr(importlib.import_module(name), "__version__", "?")
        except Exception as exc:  # any import failure is what the operator needs to see
            missing[name] = f"{type(exc).__name__}: {exc}"
    cuda = torch.cuda.is_available()
    return {"python": sys.version.split()[0], "torch": torch.__version__,
            "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0) if cuda else None,
            "versions": versions, "missing": missing}


def bench(work: Path, tiny: bool, repeats: int, base_dtype: str, timeout: float) -> dict:
    path = work / f"bench_{base_dtype}.json"
    cmd = ["step", "--json", str(path), "--rows", BENCH_ROWS,
           "--repeats", str(repeats), "--warmup", "0" if tiny else "1",
           "--set", "model.mixed_precision=fp16", "--set", f"model.base_dtype={base_dtype}"]
    if tiny:
        cmd += ["--preset", "tiny", "--model", "random:tiny", "--device", "cpu",
                "--set", "sampling.resolution=32", "--set", "train.batch_size=3"]
    else:
        cmd += ["--preset", "bench_sd35m"]
    _run("marble.tools.bench", cmd, tiny, timeout=timeout)
    res = json.loads(path.read_text())
    return {"balancers": {m: {k: v for k, v in r.items() if not k.endswith("_all")}
                          for m, r in res["balancers"].items()},
            "ratios": res["ratios"], "mixed_precision_run": res["mixed_precision"],
            "base_dtype": base_dtype, "memory_kind": res["memory_kind"], "gpu": res.get("gpu"),
            "adapter_switch": res.get("adapter_switch")}


def rollout(work: Path, tiny: bool, timeout: float) -> dict:
    path = work / "rollout.json"
    table = prompt_table(work)
    cmd = ["rollout", "--json", str(path), "--repeats", "1", "--table", str(table)]
    if tiny:
        cmd += ["--preset", "tiny", "--model", "random:tiny", "--device", "cpu",
                "--set", "sampling.resolution=32", "--set", "sampling.num_steps=3"]
    else:
        cmd += ["--preset", "bench_sd35m", "--set", "model.mixed_precision=fp16"]
    _run("marble.tools.bench", cmd, tiny, timeout=timeout)
    return json.loads(path.read_text())


def profile(work: Path, tiny: bool, timeout: float) -> dict:
    path = work / "profile.json"
    _run("marble.tools.gpu_check", ["--phase", "profile", "--out", str(path)]
         + (["--tiny"] if tiny else []), tiny, timeout=timeout)
    return json.loads(path.read_text())


def _profile_phase(tiny: bool) -> dict:
    from marble.config import load_config
    from marble.tools.gpu_profile import profile_micro_steps

    if tiny:
        cfg = load_config("tiny", overrides=["sampling.resolution=32", "train.batch_size=3"])
        return profile_micro_steps(cfg, "cpu", model_path="random:tiny")
    cfg = load_config("bench_sd35m", overrides=["model.mixed_precision=fp16"])
    return profile_micro_steps(cfg, "cuda")


def score(work: Path, tiny: bool, timeout: float) -> dict:
    """The score phase (marble.tools.gpu_score) in its own process; on a timeout or crash,
    the scorers it finished (it rewrites its JSON after each) are kept beside the error."""
    path = work / "score.json"
    prompt_table(work)  # built here: the phase's process reads it
    try:
        _run("marble.tools.gpu_check", ["--phase", "score", "--out", str(path), "--work", str(work)]
             + (["--tiny"] if tiny else []), tiny, timeout=timeout)
    except Exception as exc:
        if path.is_file():
            exc.partial = json.loads(path.read_text())
        raise
    return json.loads(path.read_text())


def prompt_table(work: Path) -> Path:
    from marble.data.cli import main as data_main

    raw, ds = work / "raw", work / "ds"
    if (ds / "train.parquet").is_file():  # one table for the rollout and training phases
        return ds / "train.parquet"
    with contextlib.redirect_stdout(sys.stderr):
        ok = data_main(["tiny", "--out", str(raw), "--n-train", "12", "--n-test", "3"]) == 0
        ok = ok and data_main(["assemble", "--raw-dir", str(raw), "--out-dir", str(ds),
                               "--rewards", ",".join(toy_rewards())]) == 0
    if not ok:
        raise RuntimeError("marble data tiny / assemble failed")
    return ds / "train.parquet"


def train_args(run: Path, table: Path, tiny: bool, steps: int) -> list[str]:
    rewards = "[" + ", ".join("{name: %s}" % n for n in toy_rewards()) + "]"
    # The held-out evaluation of rho_07 (every 10 steps, step 0 and the last) on 2 prompts.
    sets = [f"data.train={table}", f"data.test={table}", "train.eval_max_prompts=2",
            "data.embed_cache=null", f"rewards={rewards}",
            "sampling.images_per_prompt=4", "sampling.batch_size=12",
            "sampling.num_batches_per_epoch=1", "train.batch_size=6", "train.save_every=1",
            "train.keep_checkpoints=5",
            # A shrunk paper step on purpose (one GPU, minutes): not the reference geometry.
            "train.allow_geometry_change=true"]
    if tiny:
        sets += ["model.path=random:tiny", "sampling.resolution=32", "sampling.num_steps=3",
                 "model.lora_rank=4", "model.lora_alpha=8", "model.max_sequence_length=16"]
    else:
        sets += ["model.path=random:sd35m", "sampling.num_steps=10"]
    cmd = ["--preset", "rho_07", "--output-dir", str(run),
           "--max-steps", str(steps), "--no-progress"]
    if tiny:
        cmd += ["--device", "cpu"]
    return cmd + [x for s in sets for x in ("--set", s)]


def _metrics(run: Path) -> list[dict]:
    keep = ("step", "time/step_s", "time/rollout_s", "memory/peak_gb", "loss_scale",
            "skipped_step", "full_solve", "grad_norm", "loss/policy", "loss/kl", "ema_decay")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [{k: r[k] for k in keep if k in r} for r in map(json.loads, filter(None, lines))]


def _file_diff(a: Path, b: Path):
    """0.0 when equal: tensor files by max |a - b| over every tensor (inf on other keys),
    other files byte for byte (0.0 or 1.0)."""
    if a.suffix == ".safetensors":
        from safetensors.torch import load_file

        x, y = load_file(str(a)), load_file(str(b))
        if x.keys() != y.keys():
            return float("inf")
        return max((float((x[k].double() - y[k].double()).abs().max()) for k in x), default=0.0)
    if a.suffix == ".pt":
        import torch

        x = torch.load(a, map_location="cpu", weights_only=True)
        y = torch.load(b, map_location="cpu", weights_only=True)
        return _tree_diff(x, y)
    if a.name == "COMPLETE":
        # The marker holds each file's sha256, and safetensors writes its header map in no fixed
        # order, so equal tensors can hash apart: the files it names must agree (their contents
        # are compared above, tensor by tensor).
        import json

        names = [sorted(json.loads(f.read_text()).get("sha256", {})) for f in (a, b)]
        return 0.0 if names[0] == names[1] else 1.0
    return 0.0 if a.read_bytes() == b.read_bytes() else 1.0


def _tree_diff(x, y) -> float:
    import torch

    if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
        if x.shape != y.shape or x.dtype != y.dtype:
            return float("inf")
        return 0.0 if torch.equal(x, y) else float((x.double() - y.double()).abs().max())
    if isinstance(x, dict) and isinstance(y, dict):
        if x.keys() != y.keys():
            return float("inf")
        return max((_tree_diff(x[k], y[k]) for k in x), default=0.0)
    if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
        if len(x) != len(y):
            return float("inf")
        return max((_tree_diff(u, v) for u, v in zip(x, y)), default=0.0)
    return 0.0 if x == y else float("inf")


def compare_checkpoints(a: Path, b: Path) -> dict:
    """Every file of checkpoint `a` (EMA `lora/` included) against the same path in `b`."""
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    extra = sorted(str(p.relative_to(b)) for p in b.rglob("*")
                   if p.is_file() and p.relative_to(b) not in files)
    diffs = {str(f): (_file_diff(a / f, b / f) if (b / f).is_file() else float("inf"))
             for f in files}
    return {"files": diffs, "extra_files": extra,
            "bitwise_equal": bool(files) and not extra and all(d == 0.0 for d in diffs.values())}


def train_and_resume(work: Path, tiny: bool) -> dict:
    table = prompt_table(work)
    straight, resumed = work / "run", work / "run_resumed"
    start = time.perf_counter()
    _run("marble.train", train_args(straight, table, tiny, 3), tiny,
         timeout=PHASE_TIMEOUTS["train"])
    train_s = time.perf_counter() - start
    shutil.copytree(straight, resumed)  # what a stop after step 2 leaves behind
    shutil.rmtree(resumed / "checkpoints" / "checkpoint-000003")
    start = time.perf_counter()
    _run("marble.train", train_args(resumed, table, tiny, 3), tiny,
         timeout=PHASE_TIMEOUTS["resume"])
    resume_s = time.perf_counter() - start
    summary = json.loads((resumed / "train_summary.json").read_text())
    ckpt = Path("checkpoints/checkpoint-000003")
    compared = compare_checkpoints(straight / ckpt, resumed / ckpt)
    return {
        "train": {"steps": _metrics(straight), "wall_s": train_s},
        "resume": {"resumed_from": Path(summary["resumed_from"] or "").name,
                   "final_step": summary["final_step"], "wall_s": resume_s,
                   "steps": _metrics(resumed)[-1:], **compared},
    }


def _phase(result: dict, name: str, fn) -> None:
    """Run one phase; its error (or timeout) is recorded and the check goes on."""
    start = time.perf_counter()
    try:
        out = fn()
        if name == "train_resume":  # its "train" and "resume" parts at the top level
            result.update(out)
        else:
            result[name] = out
        status = "ok"
    except Exception as exc:  # a failed phase must not hide the others' figures
        status = f"{type(exc).__name__}: {str(exc)[-2000:]}"
        if getattr(exc, "partial", None) is not None:  # what the phase finished (score)
            result[name] = exc.partial
    result["phases"][name] = {"status": status, "wall_s": time.perf_counter() - start}


def gpu_check(tiny: bool = False, work: str | None = None, repeats: int = 2) -> dict:
    tmp = None
    if work is None:
        tmp = tempfile.TemporaryDirectory(prefix="marble-gpu-check-")
        work = tmp.name
    root = Path(work)
    root.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    result: dict = {"tiny": tiny, "phases": {}, "phase_timeouts_s": PHASE_TIMEOUTS,
                    "budget_s": BUDGET_S}
    t = PHASE_TIMEOUTS
    try:
        _phase(result, "env", env_info)
        for base in ("fp32", "fp16"):
            name = f"bench_{base}_base"
            _phase(result, name, lambda b=base, n=name: bench(root, tiny, repeats, b, t[n]))
        _phase(result, "rollout", lambda: rollout(root, tiny, t["rollout"]))
        _phase(result, "profile", lambda: profile(root, tiny, t["profile"]))
        _phase(result, "score", lambda: score(root, tiny, t["score"]))
        _phase(result, "train_resume", lambda: train_and_resume(root, tiny))
    finally:
        if tmp is not None:
            tmp.cleanup()
    result["wall_s"] = time.perf_counter() - start
    # The page's cost table from its one transcription; imported here, as every marble module
    # this tool uses, so that `--help` and the plumbing stay import-light.
    from marble.report.published import COST

    result["paper_8xH200"] = {**{name: {"time": speed, "memory_gb": gb} for name, (speed, gb) in COST.items()},
                              "note": "paper cost table: relative throughput, memory per GPU"}
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m marble.tools.gpu_check",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="tiny model on the CPU (plumbing only)")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    p.add_argument("--work", default=None, help="keep runs here (default: a temp folder)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--phase", choices=["profile", "score"], default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.phase == "profile":  # the profile phase's own process
        result = _profile_phase(args.tiny)
    elif args.phase == "score":  # the score phase's own process (writes --out as it goes)
        from marble.tools.gpu_score import score_phase

        work = Path(args.work)
        result = score_phase(prompt_table(work), work, args.tiny, args.out)
    else:
        result = gpu_check(args.tiny, args.work, args.repeats)
    from marble.runtime.io import json_text

    text = json_text(json.loads(json.dumps(result, default=float)), indent=2)  # strict: NaN -> null
    if args.out is not None:
        from marble.runtime.io import write_text

        write_text(args.out, text + "\n")
    if args.phase is None:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
