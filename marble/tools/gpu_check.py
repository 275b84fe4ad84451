"""`make gpu-check`: the paper path on one GPU in a few minutes; prints one JSON.

    python -m marble.tools.gpu_check [--out FILE] [--work DIR]      # one GPU (<= 8 min on an H200)
    python -m marble.tools.gpu_check --tiny                         # CPU plumbing check (CI)

1. `marble bench step --preset bench_sd35m` in fp16 (+GradScaler) and in bf16: step time
   and peak memory of weighted_sum / marble / mgda, as the bench reports them.
2. A 3-step run of the `rho_07` preset's code path (marble balancer, full solve at step
   0, amortized steps after; fp16 autocast + GradScaler over fp32 base weights) on a
   random-init SD3.5 Medium with the toy rewards standing in for the scorers, on
   cuda:LOCAL_RANK; then its resume: the run folder cut back to step 2 and run to 3
   again, compared with the straight run.

Each part runs in its own process (clean peak-memory counters); `--tiny` swaps in the
tiny model, 32 px and the CPU, in this process, so a test proves the plumbing without a GPU.
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

TOY_REWARDS = ["toy_brightness", "toy_saturation", "toy_text_contrast", "toy_color_match"]


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


def bench(work: Path, tiny: bool, repeats: int) -> dict:
    out = {}
    for mp in ("fp16", "bf16"):
        path = work / f"bench_{mp}.json"
        cmd = ["step", "--json", str(path),
               "--repeats", str(repeats), "--warmup", "0" if tiny else "1",
               "--set", f"model.mixed_precision={mp}"]
        if tiny:
            cmd += ["--preset", "tiny", "--model", "random:tiny", "--device", "cpu",
                    "--set", "sampling.resolution=32", "--set", "train.batch_size=3"]
        else:
            cmd += ["--preset", "bench_sd35m"]
        _run("marble.tools.bench", cmd, tiny, timeout=240)
        res = json.loads(path.read_text())
        out[mp] = {"balancers": {m: {k: v for k, v in r.items() if not k.endswith("_all")}
                                 for m, r in res["balancers"].items()},
                   "ratios": res["ratios"], "mixed_precision_run": res["mixed_precision"],
                   "memory_kind": res["memory_kind"], "gpu": res.get("gpu")}
    return out


def prompt_table(work: Path) -> Path:
    from marble.data.cli import main as data_main

    raw, ds = work / "raw", work / "ds"
    with contextlib.redirect_stdout(sys.stderr):
        ok = data_main(["tiny", "--out", str(raw), "--n-train", "12", "--n-test", "3"]) == 0
        ok = ok and data_main(["assemble", "--raw-dir", str(raw), "--out-dir", str(ds),
                               "--rewards", ",".join(TOY_REWARDS)]) == 0
    if not ok:
        raise RuntimeError("marble data tiny / assemble failed")
    return ds / "train.parquet"


def train_args(run: Path, table: Path, tiny: bool, steps: int) -> list[str]:
    rewards = "[" + ", ".join("{name: %s}" % n for n in TOY_REWARDS) + "]"
    sets = [f"data.train={table}", "data.embed_cache=null", f"rewards={rewards}",
            "sampling.images_per_prompt=4", "sampling.batch_size=12",
            "sampling.num_batches_per_epoch=1", "train.batch_size=6", "train.save_every=1",
            "train.keep_checkpoints=5"]
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


def _max_abs_diff(a: Path, b: Path) -> float:
    from safetensors.torch import load_file

    x, y = load_file(str(a)), load_file(str(b))
    if x.keys() != y.keys():
        return float("inf")
    return max(float((x[k].double() - y[k].double()).abs().max()) for k in x)


def train_and_resume(work: Path, tiny: bool) -> dict:
    table = prompt_table(work)
    straight, resumed = work / "run", work / "run_resumed"
    start = time.perf_counter()
    _run("marble.train", train_args(straight, table, tiny, 3), tiny, timeout=300)
    train_s = time.perf_counter() - start
    shutil.copytree(straight, resumed)  # what a stop after step 2 leaves behind
    shutil.rmtree(resumed / "checkpoints" / "checkpoint-000003")
    start = time.perf_counter()
    _run("marble.train", train_args(resumed, table, tiny, 3), tiny, timeout=240)
    resume_s = time.perf_counter() - start
    summary = json.loads((resumed / "train_summary.json").read_text())
    ckpt = "checkpoints/checkpoint-000003/adapters.safetensors"
    diff = _max_abs_diff(straight / ckpt, resumed / ckpt)
    return {
        "train": {"steps": _metrics(straight), "wall_s": train_s},
        "resume": {"resumed_from": Path(summary["resumed_from"] or "").name,
                   "final_step": summary["final_step"], "wall_s": resume_s,
                   "steps": _metrics(resumed)[-1:],
                   "adapters_max_abs_diff_vs_straight": diff, "bitwise_equal": diff == 0.0},
    }


def gpu_check(tiny: bool = False, work: str | None = None, repeats: int = 3) -> dict:
    tmp = None
    if work is None:
        tmp = tempfile.TemporaryDirectory(prefix="marble-gpu-check-")
        work = tmp.name
    root = Path(work)
    root.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    try:
        result = {"tiny": tiny, "bench": bench(root, tiny, repeats)}
        result.update(train_and_resume(root, tiny))
    finally:
        if tmp is not None:
            tmp.cleanup()
    result["wall_s"] = time.perf_counter() - start
    result["paper_8xH200"] = {"weighted_sum": {"time": 1.00, "memory_gb": 59},
                              "mgda": {"time": 0.56, "memory_gb": 67},
                              "marble": {"time": 0.97, "memory_gb": 67},
                              "note": "paper cost table: relative throughput, memory per GPU"}
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m marble.tools.gpu_check",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="tiny model on the CPU (plumbing only)")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    p.add_argument("--work", default=None, help="keep runs here (default: a temp folder)")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    result = gpu_check(args.tiny, args.work, args.repeats)
    text = json.dumps(result, indent=2, default=float)
    if args.out is not None:
        from marble.runtime.io import write_text

        write_text(args.out, text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
