"""What a plan costs before it runs: GPU-hours and wall time per paper table and in total.

A run's wall time = max_steps x seconds per optimizer step x its balancer's slowdown; its
GPU-hours = wall time x nodes x GPUs per node. The seconds per step come from, in order:
1. `measured`: a run folder's own `time/step_s` (median), when the run trained before;
2. `bench`: `marble bench step` at this preset's scale (same preset family and device kind):
   the weighted sum's micro-step time x micro-steps per optimizer step, plus the rollout
   (its share from the FLOP model below, the bench times no rollout);
3. a documented default: on GPUs the FLOP model (H200 peak x an assumed utilisation), on the
   CPU the measured tiny micro-step of docs (environment.md).
Evaluation jobs are not counted (their length depends on eval.limit and the datasets).
"""

from __future__ import annotations

from dataclasses import dataclass

from marble.config import grad_accumulation, training_timesteps

# NVIDIA H200 datasheet: 989 TFLOP/s dense FP16/BF16 tensor-core peak (the paper's GPUs).
H200_PEAK_FLOPS = 989e12
# An assumption, not a measurement: 40% model-FLOP utilisation for a 2 B DiT at 1024 tokens.
ASSUMED_MFU = 0.40
# SD3.5 Medium transformer parameters (measured, docs/environment.md, 2026-11-30).
SD35M_PARAMS = 2.243e9
# One tiny-preset micro-step on this project's 2-core CPUs (docs/environment.md: "one
# DiffusionNFT LoRA step (batch 8, 16x32x32 latents): ~0.14 s").
TINY_MICRO_STEP_S = 0.14
# Forward-equivalents per trained sample and timestep: v_old and v_ref (no grad), v_theta,
# and its backward (about one forward: LoRA skips the frozen weights' gradients).
TRAIN_FORWARDS = 4
# Slowdown vs the weighted sum when no bench measured it: the paper's relative speeds
# (MARBLE project page, 8xH200): MARBLE amortized 0.97x, a full solve every step 0.56x.
PUBLISHED_SLOWDOWN = {"weighted_sum": 1.0, "equal_alpha": 1.0, "marble": 1 / 0.97, "mgda": 1 / 0.56}


@dataclass(frozen=True)
class StepTime:
    seconds: float  # per optimizer step, weighted-sum balancer
    source: str


@dataclass(frozen=True)
class RunShape:
    """What the estimate needs of a run's resolved config (marble.config.RunConfig)."""
    max_steps: int
    balancer: str
    micro_steps: int  # grad_accumulation x T_train
    rollout_forwards: int  # transformer forwards of one step's rollouts, per GPU
    train_forwards: int  # forward-equivalents of one step's training, per GPU
    tokens: int  # image tokens per sample (patch 2 on the x8 latent)
    paper_scale: bool  # SD3.5M-sized (the FLOP model applies)


def run_shape(cfg) -> RunShape:
    """A RunShape from a marble.config.RunConfig."""
    s, t = cfg.sampling, cfg.train
    images = s.batch_size * s.num_batches_per_epoch  # per GPU (batch sizes are per process)
    cfg_passes = 2 if (s.guidance_scale or 1.0) > 1.0 else 1
    return RunShape(
        max_steps=t.max_steps, balancer=cfg.balancer.method,
        micro_steps=grad_accumulation(cfg) * training_timesteps(cfg),
        rollout_forwards=images * s.num_steps * cfg_passes,
        train_forwards=images * training_timesteps(cfg) * TRAIN_FORWARDS,
        tokens=(s.resolution // 16) ** 2,
        paper_scale="stable-diffusion-3.5" in str(cfg.model.path) or "sd35m" in str(cfg.model.path))


def rollout_share(shape: RunShape) -> float:
    """Rollout work over training work in one step (the bench times training only)."""
    return shape.rollout_forwards / shape.train_forwards


def default_step_time(shape: RunShape, gpus: int) -> StepTime:
    """The FLOP model on GPUs, the measured tiny micro-step on the CPU."""
    if gpus and shape.paper_scale:
        flops = 2 * SD35M_PARAMS * shape.tokens * (shape.rollout_forwards + shape.train_forwards)
        seconds = flops / (H200_PEAK_FLOPS * ASSUMED_MFU)
        return StepTime(seconds, f"default: FLOP model, {flops:.2g} FLOP/GPU/step at "
                        f"{ASSUMED_MFU:.0%} of an H200's {H200_PEAK_FLOPS / 1e12:.0f} TFLOP/s "
                        "(an assumption: measure with `marble bench step`)")
    seconds = TINY_MICRO_STEP_S * shape.micro_steps * (1 + rollout_share(shape))
    return StepTime(seconds, f"default: {TINY_MICRO_STEP_S} s per micro-step x "
                    f"{shape.micro_steps} (+ rollout), docs/environment.md")


def bench_step_time(shape: RunShape, bench: dict | None, gpus: int) -> StepTime | None:
    """From `marble bench step` JSON, when it ran at this run's scale on this kind of device."""
    if not bench:
        return None
    on_gpu = str(bench.get("device", "")).startswith("cuda")
    same_scale = str(bench.get("preset", "")).startswith("bench_sd35m") == shape.paper_scale
    micro = ((bench.get("balancers") or {}).get("weighted_sum") or {}).get("step_s")
    if not isinstance(micro, (int, float)) or on_gpu != bool(gpus) or not same_scale:
        return None
    seconds = micro * shape.micro_steps * (1 + rollout_share(shape))
    return StepTime(seconds, f"bench: {micro:.3g} s per micro-step x {shape.micro_steps} "
                    f"(+ rollout) on {bench.get('gpu') or bench.get('device')}")


def slowdown(balancer: str, bench: dict | None) -> float:
    """Time per step vs the weighted sum: the bench's MARBLE-run / full-solve ratio when the
    bench is given, else the paper's relative speeds."""
    ratios = (bench or {}).get("ratios") or {}
    run = ((bench or {}).get("marble_run") or {}).get("retain") or {}
    measured = {"marble": run.get("time"), "mgda": (ratios.get("mgda") or {}).get("time")}
    value = measured.get(balancer)
    if isinstance(value, (int, float)) and value > 0:
        return float(value)
    return PUBLISHED_SLOWDOWN.get(balancer, 1.0)


@dataclass(frozen=True)
class RunCost:
    run: str
    gpus: int
    wall_h: float
    step: StepTime

    @property
    def gpu_h(self) -> float:
        return self.wall_h * self.gpus


def run_cost(name: str, shape: RunShape, geometry: tuple[int, int], bench: dict | None = None,
             measured_step_s: float | None = None) -> RunCost:
    """The estimate for one run; geometry = (nodes, GPUs per node)."""
    gpus = geometry[0] * geometry[1]
    if measured_step_s:
        step = StepTime(measured_step_s, "measured: the run's own time/step_s (median)")
        factor = 1.0  # already this balancer's time
    else:
        step = bench_step_time(shape, bench, gpus) or default_step_time(shape, gpus)
        factor = slowdown(shape.balancer, bench)
    return RunCost(name, gpus, shape.max_steps * step.seconds * factor / 3600, step)


OTHER = "other runs"  # configured runs in no paper table (`all` trains them too)


def _total(names: list[str], costs: dict[str, RunCost]) -> dict:
    return {"runs": names, "gpu_h": sum(costs[n].gpu_h for n in names),
            "wall_h_parallel": max((costs[n].wall_h for n in names), default=0.0),
            "wall_h_serial": sum(costs[n].wall_h for n in names)}


def plan_cost(by_table: dict[str, list[str]], costs: dict[str, RunCost]) -> dict:
    """Per table, the paper tables' total and everything configured (each run once,
    however many tables it is in)."""
    tables = {}
    for table, names in by_table.items():
        rows = [costs[n] for n in names]
        tables[table] = {"runs": names, "gpus_per_run": max((c.gpus for c in rows), default=0),
                         "wall_h": max((c.wall_h for c in rows), default=0.0),
                         "gpu_h": sum(c.gpu_h for c in rows)}
    def unique(keep):
        return list(dict.fromkeys(n for t, names in by_table.items() if keep(t) for n in names))
    return {"tables": tables, "total": _total(unique(lambda t: t != OTHER), costs),
            "all_configured": _total(unique(lambda t: True), costs)}


def duration(hours: float) -> str:
    """1.5 h, 12 min or 40 s: a tiny run's minutes stay readable beside a paper run's hours."""
    if hours >= 1:
        return f"{hours:.1f} h"
    return f"{hours * 60:.1f} min" if hours * 60 >= 1 else f"{hours * 3600:.0f} s"


def format_plan(plan: dict, costs: dict[str, RunCost], bench_note: str = "") -> str:
    """The lines a dry run prints: "rho_ablation: 5 runs x 16 GPUs x 28.9 h = 2312 GPU-h"."""
    lines = ["Plan (training only; evaluation jobs not counted):"]
    for table, t in plan["tables"].items():
        if not t["runs"]:
            lines.append(f"  {table}: no training run" + (f" ({bench_note})" if table == "cost"
                                                          and bench_note else ""))
            continue
        where = f"{t['gpus_per_run']} GPUs" if t["gpus_per_run"] else "CPU (no GPU)"
        lines.append(f"  {table}: {len(t['runs'])} runs x {where} x {duration(t['wall_h'])} "
                     f"= {t['gpu_h']:.0f} GPU-h ({', '.join(t['runs'])})")
    for label, key in (("paper tables, each run once", "total"),
                       ("every configured run (`all`)", "all_configured")):
        total = plan[key]
        if key == "all_configured" and total["runs"] == plan["total"]["runs"]:
            continue
        lines.append(f"  {label}: {len(total['runs'])} runs, {total['gpu_h']:.0f} GPU-h; "
                     f"wall {duration(total['wall_h_parallel'])} side by side, "
                     f"{duration(total['wall_h_serial'])} one after another")
    for source in dict.fromkeys(c.step.source for c in costs.values()):
        per = [c for c in costs.values() if c.step.source == source]
        lines.append(f"  step time {per[0].step.seconds:.3g} s ({source}): "
                     + ", ".join(c.run for c in per))
    return "\n".join(lines)
