"""`marble bench step`: one training micro-step per balancer, timed side by side.

    marble bench step --preset tiny --json OUT.json [--repeats 5] [--warmup 1]
    marble bench step --preset bench_sd35m --json OUT.json      # on a GPU, paper scale
    marble bench flops --preset bench_sd35m --json OUT.json     # counted, any machine

In one process: build the preset's model (adapters "default" + "old"), one fixed
synthetic micro-batch (random x0, embeddings, K rewards with a mask pattern) and one AdamW,
then per repeat, interleaved, for every row of ROWS: forward v_old, v_ref, v_theta, the
balancer's backward and the optimizer step. Reports median seconds, peak memory (total,
over the loaded weights, and over the step's start) and ratios to weighted_sum.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

from marble.tools.bench_memory import MemoryProbe, fix_malloc
from marble.tools.bench_rollout import bench_rollout
from marble.tools.bench_switch import time_adapter_switch
from marble.tools.micro_step_call import one_micro_step

# Row -> (method, balancer overrides, micro_index, prime the alpha cache, what it is).
ROWS = {
    "weighted_sum": ("weighted_sum", {}, 1, False,
                     "the DiffusionNFT baseline: one backward of the mean-reward loss"),
    "marble": ("marble", {"amortize_every": 10**9, "warmup_steps": 0}, 1, True,
               "an amortized step (cached alpha): one backward of sum_k alpha_k L_k, one "
               "loss evaluation; what every micro-step of a MARBLE run but one in "
               "amortize_every x grad_accumulation x T_train costs"),
    "marble_recompute": ("marble", {"warmup_steps": 10**9, "full_solve": "recompute"}, 1,
                         False, "a MARBLE full solve with balancer.full_solve=recompute: "
                         "one forward + backward per reward and one for KL, no graph retained"),
    "mgda": ("mgda", {}, 1, False, "a full solve as the reference runs it (full_solve=retain: "
             "K reward + 1 KL backward passes on one retained graph), no diagnostics"),
    "mgda_diag": ("mgda", {"diagnostics_every": 1}, 0, False,
                  "the same full solve with the diagnostics it runs in training on each "
                  "micro-step of a diagnostic step: cosines and one more backward for the "
                  "weighted-sum direction"),
    "marble_exact": ("marble", {"fresh": "exact", "alpha_ema": 0.0}, 1, False,
                     "the exact fresh balance (balancer.fresh=exact): a full solve from "
                     "per-sample gradients, two backward passes for the K rewards and one for KL"),
}
BALANCERS = tuple(ROWS)
NOTES = ("Timed per row: one micro-step = no-grad forwards of v_old (adapter 'old') and "
         "v_ref (adapters off), the v_theta forward, the balancer's backward (incl. its "
         "all-reduce calls, no-ops on one process) and the optimizer step (clip_grad_norm_, "
         "AdamW.step with lr 0 so every repeat sees the same weights, zero_grad), "
         "CUDA-synchronised: step_s is wall time; step_cpu_s the process CPU time (on a "
         "shared CPU machine with --threads 1 the steadier measure of the work; meaningless "
         "on a GPU). One fixed synthetic batch; rows interleaved, order reversed "
         "every other repeat; medians over repeats after warm-up. Rows run with "
         "diagnostics_every=0 unless named *_diag. Memory: peak_mb = total (weights, "
         "optimizer state and activations: what the paper's GB column measures), "
         "peak_over_weights_mb = total minus what the loaded model held, peak_step_mb = over "
         "the step's start. marble_run: a MARBLE run's mean micro-step time, ((M - 1) marble "
         "+ 1 full solve) / M with M = amortize_every x grad_accumulation x T_train, and its "
         "peak = max(marble, the full-solve row).")


def synthetic_batch(pipe, cfg, device, seed: int = 0):
    """Random x0, x_t, sigma, embeddings and a [B, K] advantage matrix with NaN masks."""
    import torch

    from marble.maths.flow import forward_process
    from marble.models.encode import latent_shape

    gen = torch.Generator().manual_seed(seed)
    b, k = cfg.train.batch_size, len(cfg.rewards)
    tcfg = pipe.transformer.config
    shape = (b, *latent_shape(pipe, cfg.sampling.resolution))
    seq = 77 + cfg.model.max_sequence_length
    x0 = torch.randn(shape, generator=gen)
    eps = torch.randn(shape, generator=gen)
    sigma = torch.rand(b, generator=gen) * 0.9 + 0.05
    adv = torch.randn(b, k, generator=gen).clamp(-3, 3)
    # Mask pattern like the paper's mix: the first two rewards always apply, reward k>=2
    # applies to every third sample offset by k (specialists such as OCR / GenEval).
    for j in range(2, k):
        adv[[i for i in range(b) if (i + j) % 3 != 0], j] = float("nan")
    batch = {
        "x0": x0, "x_t": forward_process(x0, eps, sigma), "sigma": sigma,
        "embeds": torch.randn(b, seq, tcfg.joint_attention_dim, generator=gen),
        "pooled": torch.randn(b, tcfg.pooled_projection_dim, generator=gen),
        "adv": adv, "avg_adv": torch.nanmean(adv, dim=1),
    }
    out = {key: v.to(device) for key, v in batch.items()}
    # Known on the host, as the trainer knows it from the rollout: no device read.
    out["present"] = tuple(bool(x) for x in torch.isfinite(adv).any(0).tolist())
    return out


def make_balancers(cfg, rows=tuple(ROWS)):
    """One balancer per row of ROWS (a primed alpha cache for the amortized row)."""
    import numpy as np

    from marble.balancers import build_balancer

    out = {}
    for row in rows:
        method, overrides, _, prime, _ = ROWS[row]
        bcfg = dataclasses.replace(cfg.balancer, **{"method": method, "diagnostics_every": 0,
                                                     **overrides})
        bal = build_balancer(bcfg, cfg.reward_names)
        if prime:  # a cached-alpha (amortized) step
            k = len(cfg.rewards)
            bal.load_state_dict({"method": method, "reward_names": cfg.reward_names,
                                 "alpha_cache": list(np.full(k, 1.0 / k)), "last_full": 0,
                                 "last_alpha": None})
        out[row] = bal
    return out


def _interleaved(run, probe: MemoryProbe, repeats: int, warmup: int, rows: tuple) -> dict:
    """Every row per repeat, order reversed every other repeat; medians after warm-up."""
    times, cpu, peaks = ({m: [] for m in rows} for _ in range(3))
    for rep in range(warmup + repeats):
        for row in (rows if rep % 2 == 0 else rows[::-1]):
            probe.start()
            start, start_cpu = time.perf_counter(), time.process_time()
            run(row)
            elapsed, used = time.perf_counter() - start, time.process_time() - start_cpu
            peak = probe.peak()
            if rep >= warmup:
                times[row].append(elapsed)
                cpu[row].append(used)
                peaks[row].append(peak)
    return {m: _median_row(times[m], cpu[m], peaks[m]) for m in rows}


def _median_row(times, cpu, peaks) -> dict:
    med = {k: statistics.median(p.get(k, p["total"]) for p in peaks)
           for k in ("total", "over_weights", "step", "reserved")}
    return {"step_s": statistics.median(times), "step_s_min": min(times), "step_s_all": times,
            "step_cpu_s": statistics.median(cpu), "step_cpu_s_all": cpu,
            "peak_mb": med["total"], "peak_over_weights_mb": med["over_weights"],
            "peak_step_mb": med["step"], "peak_reserved_mb": med["reserved"],
            "peak_mb_all": [p["total"] for p in peaks],
            "peak_over_weights_mb_all": [p["over_weights"] for p in peaks]}


def _paired(xs, ys) -> float:
    if not xs or not ys or len(xs) != len(ys):
        return float("nan")
    return statistics.median(_ratio(x, y) for x, y in zip(xs, ys))


def _ratio(a, b) -> float:
    return a / b if b > 0 else float("nan")


def summarize(result: dict, micro_steps_per_solve: int) -> dict:
    """Ratios of every row to weighted_sum, and the `marble_run` estimate (see NOTES)."""
    ws = result["weighted_sum"]
    ratios = {m: {"time": _ratio(r["step_s"], ws["step_s"]),
                  "time_cpu": _ratio(r["step_cpu_s"], ws["step_cpu_s"]),
                  # median over repeats of this row / weighted_sum in the same repeat: steadier
                  # when the machine's load drifts
                  "time_paired": _paired(r.get("step_s_all"), ws.get("step_s_all")),
                  "time_cpu_paired": _paired(r.get("step_cpu_s_all"), ws.get("step_cpu_s_all")),
                  "memory": _ratio(r["peak_mb"], ws["peak_mb"]),
                  "memory_over_weights": _ratio(r["peak_over_weights_mb"],
                                                ws["peak_over_weights_mb"]),
                  "memory_step": _ratio(r["peak_step_mb"], ws["peak_step_mb"])}
              for m, r in result.items() if m != "weighted_sum"}
    m, amortized = micro_steps_per_solve, result.get("marble")
    run = {}
    for mode, full_row in (("retain", "mgda"), ("recompute", "marble_recompute")):
        if amortized is None or full_row not in result:
            continue
        full = result[full_row]
        step_s, step_cpu_s = (((m - 1) * amortized[k] + full[k]) / m
                              for k in ("step_s", "step_cpu_s"))
        peak = {k: max(amortized[k], full[k]) for k in ("peak_mb", "peak_over_weights_mb")}
        run[mode] = {"step_s": step_s, "step_cpu_s": step_cpu_s, **peak,
                     "time": _ratio(step_s, ws["step_s"]),
                     "time_cpu": _ratio(step_cpu_s, ws["step_cpu_s"]),
                     "memory": _ratio(peak["peak_mb"], ws["peak_mb"]),
                     "memory_over_weights": _ratio(peak["peak_over_weights_mb"],
                                                   ws["peak_over_weights_mb"])}
    ratios_min = {m: _ratio(result[m]["step_s_min"], ws["step_s_min"]) for m in ratios}
    return {"ratios": ratios, "ratios_min_time": ratios_min,
            "marble_run": {"micro_steps_per_solve": m, **run}}


def bench_step(cfg, repeats: int = 5, warmup: int = 1, device: str | None = None,
               model_path: str | None = None, rows: tuple = BALANCERS) -> dict:
    """Time `rows` (default: all of ROWS) on one fixed micro-batch; the JSON-ready result."""
    unknown = sorted(set(rows) - set(ROWS))
    if unknown or "weighted_sum" not in rows:
        raise ValueError(f"bench rows {unknown or list(rows)}: pick from {list(ROWS)}, "
                         "weighted_sum included (the ratios' base)")
    import torch

    from marble.config import grad_accumulation, training_timesteps
    from marble.models.policy import load_policy
    from marble.runtime.precision import make_precision, optimizer_update

    fix_malloc()
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    mp = cfg.model.mixed_precision if dev.type == "cuda" else "no"
    path = model_path or cfg.model.path
    probe = MemoryProbe(dev)
    # The model as training loads it (base in model.base_dtype, fp32 by default like the
    # reference); autocast off on the CPU.
    pipe, params = load_policy(dataclasses.replace(cfg.model, mixed_precision=mp),
                               cfg.train.seed, dev, path=path)
    weights_mb = probe.loaded()
    t = cfg.train
    optimizer = torch.optim.AdamW(params, lr=0.0, betas=tuple(t.adam_betas),
                                  weight_decay=t.weight_decay, eps=t.adam_eps)
    autocast = make_precision(mp, dev)
    batch = synthetic_batch(pipe, cfg, dev, seed=t.seed)
    balancers = make_balancers(cfg, rows)

    def run(row: str) -> None:
        one_micro_step(pipe, cfg, batch, balancers[row], params, autocast,
                       micro_index=ROWS[row][2])
        # The training loop's update: all-reduce, found-inf over ranks, unscale, clip, step.
        optimizer_update(params, optimizer, autocast, t.max_grad_norm)
        if dev.type == "cuda":
            torch.cuda.synchronize()

    optimizer.zero_grad(set_to_none=True)
    result = _interleaved(run, probe, repeats, warmup, tuple(rows))
    switch = time_adapter_switch(pipe.transformer, (batch["x_t"], batch["sigma"],
                                                    batch["embeds"], batch["pooled"]), autocast)
    per_solve = cfg.balancer.amortize_every * grad_accumulation(cfg) * training_timesteps(cfg)
    return {
        "balancers": result, **summarize(result, per_solve), "adapter_switch": switch,
        "rows": {m: ROWS[m][4] for m in rows}, "weights_mb": weights_mb,
        "preset": cfg.preset, "model_path": path,
        "device": str(dev), "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
        "mixed_precision": mp, "memory_kind": probe.kind, "repeats": repeats, "warmup": warmup,
        "threads": torch.get_num_threads(), "batch_size": t.batch_size,
        "resolution": cfg.sampling.resolution, "num_rewards": len(cfg.rewards),
        "lora_params": sum(p.numel() for p in params), "torch": torch.__version__,
        "notes": NOTES,
    }


def print_table(res: dict) -> None:
    print(f"bench step: preset={res['preset']} device={res['device']} "
          f"mp={res['mixed_precision']} repeats={res['repeats']} threads={res['threads']} "
          f"memory={res['memory_kind']}")
    print(f"weights loaded: {res['weights_mb']:.1f} MB; x = ratio to weighted_sum "
          "(time; memory total / over the loaded weights)")
    print(f"{'row':<22}{'step_s':>8}{'cpu_s':>8}{'total_mb':>10}{'over_w_mb':>10}"
          f"{'time x':>8}{'cpu x':>7}{'mem x':>7}{'over_w x':>9}")
    one = {"time": 1.0, "time_cpu": 1.0, "memory": 1.0, "memory_over_weights": 1.0}
    rows = list(res["balancers"].items())
    rows += [(f"marble_run:{mode}", res["marble_run"][mode]) for mode in ("retain", "recompute")
             if mode in res["marble_run"]]
    for m, r in rows:
        ratio = r if m.startswith("marble_run") else res["ratios"].get(m, one)
        print(f"{m:<22}{r['step_s']:>8.4f}{r['step_cpu_s']:>8.4f}{r['peak_mb']:>10.1f}"
              f"{r['peak_over_weights_mb']:>10.1f}{ratio['time']:>8.3f}{ratio['time_cpu']:>7.3f}"
              f"{ratio['memory']:>7.3f}{ratio['memory_over_weights']:>9.3f}")


def _print_switch(res: dict) -> None:
    sw = res.get("adapter_switch")
    if sw:
        print(f"adapter switches per micro-step: {1e3 * sw['switches_cpu_s']:.3f} ms CPU "
              f"= {sw['ratio_to_forward']:.4f} x one no-grad forward (CPU time, noisy)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="marble bench", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("step", help="balancer micro-step time and peak memory")
    s.add_argument("--preset", required=True)
    s.add_argument("--json", required=True, type=Path, help="output JSON file")
    s.add_argument("--repeats", type=int, default=5)
    s.add_argument("--warmup", type=int, default=1)
    s.add_argument("--rows", default=",".join(ROWS),
                   help=f"comma-separated subset of {','.join(ROWS)} (weighted_sum included)")
    s.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's); 1 is steadier on a busy machine")
    s.add_argument("--config", action="append", default=[], metavar="FILE")
    s.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    s.add_argument("--device", choices=["cpu", "cuda"], default=None)
    s.add_argument("--model", default=None,
                   help="model path override (default: the preset's; `random:tiny` when the "
                        "preset's local folder is missing)")
    f = sub.add_parser("flops", help="counted FLOPs, passes and live-tensor peak per row "
                       "(meta tensors, deterministic) and each preset's whole-run overhead")
    f.add_argument("--preset", required=True)
    f.add_argument("--json", type=Path, default=None,
                   help="output JSON file (default: the tables on stdout only)")
    f.add_argument("--md", type=Path, default=None, help="also write the markdown tables here")
    f.add_argument("--layers", type=int, default=None,
                   help="transformer depth override (same widths; quick checks)")
    f.add_argument("--rows", default=None, help="comma-separated subset of the rows "
                   "(default: all; weighted_sum included)")
    f.add_argument("--runs", default=None, help="comma-separated presets whose whole-run "
                   "overhead to price (default: the paper presets, or tiny_* for tiny)")
    r = sub.add_parser("rollout", help="rollout batch time with vs without the embedding cache")
    r.add_argument("--preset", required=True)
    r.add_argument("--json", required=True, type=Path, help="output JSON file")
    r.add_argument("--repeats", type=int, default=3)
    r.add_argument("--table", default=None, help="prompt table (default: the preset's data.train)")
    r.add_argument("--cache", default=None, help="embedding cache folder (default: a temp one)")
    r.add_argument("--warmup", type=int, default=1, help=argparse.SUPPRESS)
    for q in (f,):
        q.add_argument("--config", action="append", default=[], metavar="FILE")
        q.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    for q in (r,):
        q.add_argument("--config", action="append", default=[], metavar="FILE")
        q.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
        q.add_argument("--device", choices=["cpu", "cuda"], default=None)
        q.add_argument("--model", default=None, help="model path override")
    return p


def _flops_main(cfg, args) -> int:
    from marble.runtime.io import write_json, write_text
    from marble.tools.bench_flops import FLOP_ROWS, bench_flops, default_rows, markdown_table

    def names(text):
        return None if text is None else tuple(x.strip() for x in text.split(",") if x.strip())

    rows = names(args.rows) or default_rows()
    if "weighted_sum" not in rows or set(rows) - set(FLOP_ROWS):
        print(f"marble bench: error: --rows {args.rows!r}: pick from {', '.join(FLOP_ROWS)}, "
              "weighted_sum included", file=sys.stderr)
        raise SystemExit(2)
    res = bench_flops(cfg, rows=rows, runs=names(args.runs), num_layers=args.layers)
    if args.json is not None:
        write_json(args.json, res)
    table = markdown_table(res)
    if args.md is not None:
        write_text(args.md, table)
    print(table, end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    from marble.config import ConfigError, load_config
    from marble.runtime.io import write_json

    args = build_parser().parse_args(argv)
    try:
        cfg = load_config(args.preset, args.config, args.overrides)
    except ConfigError as exc:
        print(f"marble bench: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.what == "flops":
        return _flops_main(cfg, args)
    if args.repeats < 1 or args.warmup < 0:
        print("marble bench: error: --repeats must be >= 1 and --warmup >= 0", file=sys.stderr)
        raise SystemExit(2)
    rows = tuple(r.strip() for r in getattr(args, "rows", "").split(",") if r.strip())
    if args.what == "step" and (set(rows) - set(ROWS) or "weighted_sum" not in rows):
        print(f"marble bench: error: --rows {args.rows!r}: pick from {', '.join(ROWS)}, "
              "weighted_sum included", file=sys.stderr)
        raise SystemExit(2)
    model = args.model
    path = cfg.model.path
    if model is None and not path.startswith("random:") and path.count("/") >= 2 \
            and not Path(path).is_dir():
        model = "random:tiny"  # the bench needs shapes, not trained weights
        print(f"marble bench: {path} not found; using random:tiny (same architecture)",
              file=sys.stderr)
    if args.what == "rollout":
        res = bench_rollout(cfg, args.table or cfg.data.train, args.repeats, args.device, model,
                            args.cache)
        write_json(args.json, res)
        print(f"bench rollout: encode {res['rollout']['encode']['batch_s']:.4f} s, cache "
              f"{res['rollout']['cache']['batch_s']:.4f} s per batch of {res['batch_size']} "
              f"(x{res['ratio_cache_to_encode']:.3f})")
        return 0
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, args.threads or threads))
    try:
        res = bench_step(cfg, args.repeats, args.warmup, args.device, model, rows)
    finally:  # a caller in the same process keeps its own setting
        torch.set_num_threads(threads)
    write_json(args.json, res)
    print_table(res)
    _print_switch(res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
