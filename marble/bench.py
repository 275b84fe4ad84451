"""`marble bench step`: one optimizer micro-step per balancer, timed side by side.

    marble bench step --preset tiny --json OUT.json [--repeats 5] [--warmup 1]
    marble bench step --preset bench_sd35m --json OUT.json      # on a GPU, paper scale

In one process: build the preset's model (adapters "default" + "old"), one fixed
synthetic micro-batch (random x0, embeddings, K rewards with a mask pattern), then per
repeat, interleaved, for weighted_sum, marble (an amortized step: cached alpha, one
backward) and mgda (full solve: K backward passes): forward v_old, v_ref, v_theta and
the balancer's backward. Reports median seconds, peak memory and ratios to weighted_sum.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import statistics
import sys
import time
from pathlib import Path

BALANCERS = ("weighted_sum", "marble", "mgda")


def _fix_malloc() -> None:
    """Fixed mmap threshold so freed activations go back to the OS (honest RSS deltas)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD; also disables its dynamic growth
    except (OSError, AttributeError):
        pass


class MemoryProbe:
    """Peak memory of one run: CUDA allocator peak, or CPU RSS high-water delta."""

    def __init__(self, device):
        import torch

        self.torch, self.device = torch, device
        self.kind = "cuda_max_memory_allocated"
        if device.type != "cuda":
            self.kind = ("cpu_rss_hwm_delta (VmHWM reset via /proc/self/clear_refs; "
                         "tracemalloc does not see torch allocations)")
            if not self._reset_hwm():
                self.kind = "cpu_ru_maxrss_delta (monotonic high-water: later runs read low)"

    @staticmethod
    def _status_kb(field: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise KeyError(field)

    @staticmethod
    def _reset_hwm() -> bool:
        try:
            Path("/proc/self/clear_refs").write_text("5")
            return True
        except OSError:
            return False

    def start(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()
            self.torch.cuda.reset_peak_memory_stats()
            self.base = self.torch.cuda.memory_allocated()
        elif self.kind.startswith("cpu_rss"):
            self._reset_hwm()
            self.base = self._status_kb("VmRSS") * 1024
        else:
            import resource

            self.base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def peak_mb(self) -> float:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()
            return (self.torch.cuda.max_memory_allocated() - self.base) / 2**20
        if self.kind.startswith("cpu_rss"):
            return max(self._status_kb("VmHWM") * 1024 - self.base, 0) / 2**20
        import resource

        return max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - self.base, 0) / 2**20


def synthetic_batch(pipe, cfg, device, seed: int = 0):
    """Random x0, x_t, sigma, embeddings and a [B, K] advantage matrix with NaN masks."""
    import torch

    from marble.models.encode import latent_shape

    gen = torch.Generator().manual_seed(seed)
    b, k = cfg.train.batch_size, len(cfg.rewards)
    tcfg = pipe.transformer.config
    shape = (b, *latent_shape(pipe, cfg.sampling.resolution))
    seq = 77 + cfg.model.max_sequence_length
    x0 = torch.randn(shape, generator=gen)
    eps = torch.randn(shape, generator=gen)
    sigma = torch.rand(b, generator=gen) * 0.9 + 0.05
    sb = sigma.view(-1, 1, 1, 1)
    adv = torch.randn(b, k, generator=gen).clamp(-3, 3)
    # Mask pattern like the paper's mix: the first two rewards always apply, reward k>=2
    # applies to every third sample offset by k (specialists such as OCR / GenEval).
    for j in range(2, k):
        adv[[i for i in range(b) if (i + j) % 3 != 0], j] = float("nan")
    batch = {
        "x0": x0, "x_t": (1 - sb) * x0 + sb * eps, "sigma": sigma,
        "embeds": torch.randn(b, seq, tcfg.joint_attention_dim, generator=gen),
        "pooled": torch.randn(b, tcfg.pooled_projection_dim, generator=gen),
        "adv": adv, "avg_adv": torch.nanmean(adv, dim=1),
    }
    return {key: v.to(device) for key, v in batch.items()}


def make_balancers(cfg):
    import numpy as np

    from marble.balancers import build_balancer

    out = {}
    for method in BALANCERS:
        bcfg = dataclasses.replace(cfg.balancer, method=method, diagnostics_every=10**9,
                                   amortize_every=10**9, warmup_steps=0)
        bal = build_balancer(bcfg, cfg.reward_names)
        if method == "marble":  # a cached-alpha (amortized) step: prime the cache
            k = len(cfg.rewards)
            bal.load_state_dict({"method": "marble", "reward_names": cfg.reward_names,
                                 "alpha_cache": list(np.full(k, 1.0 / k)), "last_full": 0,
                                 "last_alpha": None})
        out[method] = bal
    return out


def one_micro_step(pipe, cfg, batch, balancer, params, autocast) -> None:
    """The trainer's micro-step (marble.microstep) on the synthetic batch, then the
    balancer's backward. `autocast` is a `marble.precision.Precision`: under fp16 its
    GradScaler scales the backward passes as in training."""
    from marble.microstep import MicroBatch, build_micro_step

    micro = MicroBatch(x0=batch["x0"], x_t=batch["x_t"], sigma=batch["sigma"],
                       prompt_embeds=batch["embeds"], pooled=batch["pooled"],
                       advantages=batch["adv"], avg_advantage=batch["avg_adv"])
    step = build_micro_step(pipe.transformer, micro, cfg.train, params, autocast, scale=1.0,
                            global_step=1, micro_index=1,
                            grad_scaler=getattr(autocast, "scaler", None))
    balancer.backward(step)


def bench_step(cfg, repeats: int = 5, warmup: int = 1, device: str | None = None,
               model_path: str | None = None) -> dict:
    """Time the three balancers on one fixed micro-batch; the JSON-ready result."""
    import torch

    from marble.models import load_pipeline
    from marble.models.lora import add_lora_adapters, trainable_lora_parameters
    from marble.precision import base_weight_dtype
    from marble.trainer import _DTYPES, autocast_factory, upcast_lora_

    _fix_malloc()
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    mp = cfg.model.mixed_precision if dev.type == "cuda" else "no"
    path = model_path or cfg.model.path
    # Base weights as in training (model.base_dtype, fp32 by default like the reference).
    base = base_weight_dtype(cfg.model.base_dtype) if dev.type == "cuda" else torch.float32
    pipe = load_pipeline(path, dtype=_DTYPES[mp], device=dev, transformer_dtype=base)
    torch.manual_seed(cfg.train.seed)
    add_lora_adapters(pipe.transformer, rank=cfg.model.lora_rank, alpha=cfg.model.lora_alpha,
                      targets=cfg.model.lora_targets, seed=cfg.train.seed)
    upcast_lora_(pipe.transformer)
    params = trainable_lora_parameters(pipe.transformer)
    autocast = autocast_factory(mp, dev)
    batch = synthetic_batch(pipe, cfg, dev, seed=cfg.train.seed)
    balancers = make_balancers(cfg)
    probe = MemoryProbe(dev)
    times = {m: [] for m in BALANCERS}
    peaks = {m: [] for m in BALANCERS}
    for rep in range(warmup + repeats):
        order = BALANCERS if rep % 2 == 0 else BALANCERS[::-1]  # interleaved, alternating order
        for method in order:
            for p in params:
                p.grad = None
            probe.start()
            start = time.perf_counter()
            one_micro_step(pipe, cfg, batch, balancers[method], params, autocast)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
            peak = probe.peak_mb()
            if rep >= warmup:
                times[method].append(elapsed)
                peaks[method].append(peak)
    result = {m: {"step_s": statistics.median(times[m]), "peak_mb": statistics.median(peaks[m]),
                  "step_s_min": min(times[m]), "step_s_all": times[m], "peak_mb_all": peaks[m]}
              for m in BALANCERS}
    ws = result["weighted_sum"]
    ratios = {m: {"time": result[m]["step_s"] / ws["step_s"],
                  "memory": (result[m]["peak_mb"] / ws["peak_mb"]) if ws["peak_mb"] > 0
                  else float("nan")} for m in ("marble", "mgda")}
    # Minimum-time ratios too: on a shared, loaded machine the minimum is the least noisy.
    ratios_min = {m: result[m]["step_s_min"] / ws["step_s_min"] for m in ("marble", "mgda")}
    return {
        "balancers": result, "ratios": ratios, "ratios_min_time": ratios_min,
        "preset": cfg.preset, "model_path": path,
        "device": str(dev), "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
        "mixed_precision": mp, "memory_kind": probe.kind, "repeats": repeats, "warmup": warmup,
        "batch_size": cfg.train.batch_size, "resolution": cfg.sampling.resolution,
        "num_rewards": len(cfg.rewards), "lora_params": sum(p.numel() for p in params),
        "torch": torch.__version__,
        "notes": "one micro-step = forwards of v_old, v_ref, v_theta + the balancer backward; "
                 "marble is an amortized (cached-alpha) step; mgda is a full solve "
                 "(K per-reward backward passes + KL, plus the weighted-sum direction for the "
                 "cosine diagnostics it logs on every solve).",
    }


def bench_rollout(cfg, table: str, repeats: int = 3, device: str | None = None,
                  model_path: str | None = None, cache_dir: str | None = None) -> dict:
    """One rollout batch (embeddings + old-policy sampling + decode), encoding the prompts
    vs reading them from the embedding cache (built in a temp folder when not given)."""
    import tempfile

    import torch

    from marble.data import load_table
    from marble.data.embed_cache import EmbeddingCache, build_cache
    from marble.models import load_pipeline
    from marble.models.encode import decode_latents, encode_prompts, latent_shape
    from marble.models.lora import add_lora_adapters, use_adapter
    from marble.sampling import sample_latents, sigma_schedule
    from marble.trainer import _DTYPES, autocast_factory

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    mp = cfg.model.mixed_precision if dev.type == "cuda" else "no"
    path = model_path or cfg.model.path
    pipe = load_pipeline(path, dtype=_DTYPES[mp], device=dev)
    add_lora_adapters(pipe.transformer, rank=cfg.model.lora_rank, alpha=cfg.model.lora_alpha,
                      targets=cfg.model.lora_targets, seed=cfg.train.seed)
    s, msl = cfg.sampling, cfg.model.max_sequence_length
    k = s.images_per_prompt
    uniq = load_table(table)["prompt"].tolist()[: max(1, s.batch_size // k)]
    prompts = [p for p in uniq for _ in range(k)][: s.batch_size]
    tmp = tempfile.TemporaryDirectory() if cache_dir is None else None
    cache_dir = cache_dir or tmp.name
    build_start = time.perf_counter()
    build_cache([table], path, cache_dir, max_sequence_length=msl, pipe=pipe,
                dtype=str(_DTYPES[mp]).replace("torch.", ""), device=str(dev))
    build_s = time.perf_counter() - build_start
    cache = EmbeddingCache(cache_dir)
    sigmas = sigma_schedule(pipe.scheduler, s.num_steps).to(dev, torch.float32)
    noise = torch.randn((len(prompts), *latent_shape(pipe, s.resolution)),
                        generator=torch.Generator().manual_seed(0)).to(dev)
    autocast = autocast_factory(mp, dev)

    def one(source: str) -> float:
        start = time.perf_counter()
        with torch.no_grad():
            if source == "cache":
                emb, pooled = (t.to(dev) for t in cache.lookup(prompts))
            else:
                emb, pooled = encode_prompts(pipe, prompts, msl)
            with use_adapter(pipe.transformer, "old"), autocast():
                x0 = sample_latents(pipe.transformer, noise, emb, pooled, sigmas, s.solver)
            decode_latents(pipe, x0.float())
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    times = {"encode": [], "cache": []}
    one("encode"), one("cache")  # warm-up
    for rep in range(repeats):
        for source in (("encode", "cache") if rep % 2 == 0 else ("cache", "encode")):
            times[source].append(one(source))
    if tmp is not None:
        tmp.cleanup()
    med = {src: statistics.median(v) for src, v in times.items()}
    return {"rollout": {src: {"batch_s": med[src], "batch_s_all": times[src]} for src in times},
            "ratio_cache_to_encode": med["cache"] / med["encode"], "cache_build_s": build_s,
            "batch_size": len(prompts), "num_steps": s.num_steps, "resolution": s.resolution,
            "preset": cfg.preset, "model_path": path, "device": str(dev), "repeats": repeats}


def print_table(res: dict) -> None:
    print(f"bench step: preset={res['preset']} device={res['device']} "
          f"mp={res['mixed_precision']} repeats={res['repeats']} memory={res['memory_kind']}")
    print(f"{'balancer':<14}{'step_s':>10}{'peak_mb':>10}{'time x':>9}{'mem x':>9}")
    for m, r in res["balancers"].items():
        ratio = res["ratios"].get(m, {"time": 1.0, "memory": 1.0})
        print(f"{m:<14}{r['step_s']:>10.4f}{r['peak_mb']:>10.1f}"
              f"{ratio['time']:>9.3f}{ratio['memory']:>9.3f}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="marble bench", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("step", help="balancer micro-step time and peak memory")
    s.add_argument("--preset", required=True)
    s.add_argument("--json", required=True, type=Path, help="output JSON file")
    s.add_argument("--repeats", type=int, default=5)
    s.add_argument("--warmup", type=int, default=1)
    s.add_argument("--config", action="append", default=[], metavar="FILE")
    s.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    s.add_argument("--device", choices=["cpu", "cuda"], default=None)
    s.add_argument("--model", default=None,
                   help="model path override (default: the preset's; `random:tiny` when the "
                        "preset's local folder is missing)")
    r = sub.add_parser("rollout", help="rollout batch time with vs without the embedding cache")
    r.add_argument("--preset", required=True)
    r.add_argument("--json", required=True, type=Path, help="output JSON file")
    r.add_argument("--repeats", type=int, default=3)
    r.add_argument("--table", default=None, help="prompt table (default: the preset's data.train)")
    r.add_argument("--cache", default=None, help="embedding cache folder (default: a temp one)")
    r.add_argument("--warmup", type=int, default=1, help=argparse.SUPPRESS)
    for q in (r,):
        q.add_argument("--config", action="append", default=[], metavar="FILE")
        q.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
        q.add_argument("--device", choices=["cpu", "cuda"], default=None)
        q.add_argument("--model", default=None, help="model path override")
    return p


def main(argv: list[str] | None = None) -> int:
    from marble.config import ConfigError, load_config
    from marble.io import write_json

    args = build_parser().parse_args(argv)
    try:
        cfg = load_config(args.preset, args.config, args.overrides)
    except ConfigError as exc:
        print(f"marble bench: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.repeats < 1 or args.warmup < 0:
        print("marble bench: error: --repeats must be >= 1 and --warmup >= 0", file=sys.stderr)
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
    res = bench_step(cfg, args.repeats, args.warmup, args.device, model)
    write_json(args.json, res)
    print_table(res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
