"""What a job costs before it runs: FLOPs from the counted table, time from a throughput.

A job's GPU-hours = its FLOPs / one GPU's throughput (FLOP/s); its wall time = that / its GPUs.
FLOPs (marble.workflow.flops: the table `marble bench flops`'s counting wrote, plus the
estimates it names):
- training, per process and optimizer step: sampling each rollout image, decoding it and
  scoring it with the run's rewards; then every micro-step of the run's cadence
  (marble.balancers.cadence: an amortized step costs exactly the weighted sum's row, a full
  solve or a diagnostic step its own), over the steps after the newest checkpoint;
- evaluation, per job: per sample the denoiser forwards (steps x CFG passes), the VAE
  decode, the text encoders, every scorer and, where the dataset scores it, the
  UnifiedReward judge, over the samples not yet in evaluation_results.jsonl;
- checkpoint writes: their bytes at an assumed write rate (seconds, not FLOPs).
Throughput, first found: the run's own `time/step_s` (a resumed run); `marble bench step`'s
weighted-sum micro-step on this kind of device (results/bench/step.json: its counted FLOPs /
its measured seconds); else the stated assumption (GPU: 40% of the peak, the MFU; CPU: the
tiny micro-step measured in docs/measurements.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from marble.config import load_config
from marble.workflow import flops as wf_flops
from marble.workflow.flops import lookup
from marble.training.heldout_schedule import evaluated_steps, heldout_rows

# Dense FP16/BF16 tensor-core peaks (NVIDIA datasheets); the paper's GPUs are H200s.
GPU_PEAKS = {"h200": 989e12, "h100": 989e12, "a100": 312e12}
DEFAULT_GPU = "h200"
# An assumption, not a measurement: 40% model-FLOP utilisation (MFU) for a 2 B DiT.
ASSUMED_MFU = 0.40
# One tiny-preset micro-step on this project's 2-core CPUs (docs/measurements.md: a micro-step
# of batch 8, 16 x 32 x 32 latents, about 0.14 s).
TINY_MICRO_STEP_S = 0.14
# A checkpoint's bytes per LoRA parameter (marble.training.checkpoint_format): the EMA export
# and the online + old adapters (fp32, 12 B), AdamW's two moments (8 B), the EMA state (4 B).
CHECKPOINT_BYTES_PER_PARAM = 24
# An assumption: a shared filesystem's sustained write rate for one job.
CHECKPOINT_WRITE_BPS = 1e9


@dataclass(frozen=True)
class Throughput:
    flops_per_s: float  # of one GPU, or of one CPU job
    gpu: bool
    source: str  # the sentence stating where the figure comes from


def _bench_flops_per_s(bench: dict | None, table: dict, gpu: bool) -> tuple[float | None, str] | None:
    """(counted FLOPs of the bench's weighted-sum micro-step / its measured median seconds, how),
    or (None, why not) for a bench of this kind of device that cannot be used; None when the
    bench ran on the other kind of device (or there is none)."""
    if not bench or str(bench.get("device", "")).startswith("cuda") != gpu:
        return None
    seconds = ((bench.get("balancers") or {}).get("weighted_sum") or {}).get("step_s")
    if not isinstance(seconds, (int, float)) or seconds <= 0:
        return None, "the bench JSON has no weighted_sum step_s"
    mp = bench.get("mixed_precision")  # as the bench ran it (a --set may change the preset's)
    try:  # quoted: YAML would read a bare `no` as false
        cfg = load_config(str(bench.get("preset")), overrides=[f'model.mixed_precision="{mp}"'] if mp else [])
        row = lookup(table, "micro_step", wf_flops.micro_key(cfg))
    except (ValueError, wf_flops.Missing) as exc:  # an unknown preset, or a shape not counted
        return None, f"the bench's shape is not usable ({exc})"
    where = bench.get("gpu") or bench.get("device")
    return row["rows"]["weighted_sum"] / seconds, (
        f"`marble bench step --preset {bench['preset']}` on {where}: "
        f"{row['rows']['weighted_sum'] / 1e12:.4g} TFLOP counted per weighted-sum micro-step "
        f"in {seconds:.3g} s")


def gpu_throughput(bench: dict | None, table: dict, gpu_type: str | None = None) -> Throughput:
    """The measured GPU figure when the bench ran on a GPU, else the assumed MFU of the peak."""
    name = (gpu_type or DEFAULT_GPU).lower()
    peak = GPU_PEAKS.get(name, GPU_PEAKS[DEFAULT_GPU])
    label = f"{name.upper()}'s {peak / 1e12:.0f} TFLOP/s peak" if name in GPU_PEAKS else \
        f"an H200's {peak / 1e12:.0f} TFLOP/s peak ({gpu_type}: no datasheet figure here)"
    rate, how = _bench_flops_per_s(bench, table, gpu=True) or (None, "")
    if rate:
        return Throughput(rate, True, f"measured, {how}: {rate / 1e12:.0f} TFLOP/s per GPU, "
                          f"{rate / peak:.0%} of {label}")
    return Throughput(peak * ASSUMED_MFU, True,
                      f"assumed: {ASSUMED_MFU:.0%} utilisation (MFU) of {label} = "
                      f"{peak * ASSUMED_MFU / 1e12:.0f} TFLOP/s per GPU (an assumption: a GPU "
                      "bench, `marble bench step --preset bench_sd35m` -> results/bench/step.json, "
                      "replaces it" + (f"; the GPU bench found is not used: {how}" if how else "") + ")")


def cpu_throughput(bench: dict | None, table: dict) -> Throughput:
    """The CPU bench's figure, else the tiny micro-step measured in docs/measurements.md."""
    measured, how = _bench_flops_per_s(bench, table, gpu=False) or (None, "")
    if measured:
        return Throughput(measured, False, f"measured, {how}: {measured / 1e9:.3g} GFLOP/s per job")
    tiny = lookup(table, "micro_step", wf_flops.micro_key(load_config("tiny")))
    rate = tiny["rows"]["weighted_sum"] / TINY_MICRO_STEP_S
    return Throughput(rate, False, f"docs/measurements.md's tiny micro-step, {TINY_MICRO_STEP_S} s "
                      f"for {tiny['rows']['weighted_sum'] / 1e9:.3g} GFLOP counted: "
                      f"{rate / 1e9:.3g} GFLOP/s per job"
                      + (f" (the CPU bench found is not used: {how})" if how else ""))


@dataclass(frozen=True)
class JobCost:
    """One job: FLOPs per part (all its processes together), on `gpus` GPUs (0: a CPU job)."""

    rule: str
    name: str
    flops: dict[str, float]
    gpus: int
    throughput: Throughput
    processes: int = 1  # processes sharing the work (wall time = the share of one)
    extra_s: float = 0.0  # wall seconds that are not FLOPs (checkpoint writes)
    detail: dict = field(default_factory=dict)

    @property
    def total_flops(self) -> float:
        return sum(self.flops.values())

    @property
    def compute_s(self) -> float:
        """Seconds of one processor's work for all FLOPs (GPU-seconds on a GPU)."""
        return self.total_flops / self.throughput.flops_per_s

    @property
    def wall_h(self) -> float:
        return (self.compute_s / max(self.processes, 1) + self.extra_s) / 3600

    @property
    def gpu_h(self) -> float:
        return self.wall_h * self.gpus if self.gpus else 0.0


def rollout_flops(cfg, table: dict) -> dict[str, float]:
    """One process's rollout of one optimizer step: sampling, VAE decode, scoring."""
    s = cfg.sampling
    images = s.batch_size * s.num_batches_per_epoch  # per process (batch sizes are per process)
    vae = wf_flops.ARCHS[wf_flops.training_arch(cfg.model.path)].vae
    return {"rollout sampling": images * lookup(table, "rollout", wf_flops.rollout_key(cfg))["flops"],
            "rollout decode": images * lookup(table, "vae_decode",
                                              wf_flops.vae_key(vae, s.resolution))["flops"],
            "rollout scoring": images * sum(wf_flops.scorer_flops(n) for n in cfg.reward_names)}


def _stage_scoring(cfg, from_step: int) -> float | None:
    """Scoring FLOPs per image summed over the remaining steps of a staged run (each stage
    scores its own rewards), or None for an unstaged run."""
    if not cfg.stages:
        return None
    total, start = 0.0, 0
    for stage in cfg.stages:
        steps = max(0, start + stage.steps - max(from_step, start))
        total += steps * sum(wf_flops.scorer_flops(n) for n in stage.rewards or cfg.reward_names)
        start += stage.steps
    return total


def heldout_flops(cfg, table: dict, test_rows: int, processes: int, from_step: int = 0) -> float:
    """One process's FLOPs of the held-out evaluations (train.eval_every, marble.training.heldout)
    still to come: its share of the test items, generated in sampling.eval_num_steps steps at
    the rollouts' per-step cost, decoded and scored by every reward of the run."""
    t, s = cfg.train, cfg.sampling
    evals = len(evaluated_steps(t.eval_every, t.max_steps, from_step))
    if not evals:
        return 0.0
    items = len(heldout_rows(test_rows, t.eval_max_prompts)) * t.eval_images_per_prompt
    per_process = -(-items // max(processes, 1))
    rollout = rollout_flops(cfg, table)
    images = s.batch_size * s.num_batches_per_epoch
    per_image = (rollout["rollout sampling"] / images * s.eval_num_steps / s.num_steps
                 + rollout["rollout decode"] / images
                 + sum(wf_flops.scorer_flops(n) for n in cfg.reward_names))
    return evals * per_process * per_image


def training_flops(cfg, table: dict, from_step: int = 0) -> dict[str, float]:
    """One process's FLOPs for the optimizer steps `from_step`..max_steps of run `cfg`
    (the held-out evaluations: `heldout_flops`)."""
    from marble.balancers.cadence import run_overhead

    steps = max(0, cfg.train.max_steps - from_step)
    parts = {k: steps * v for k, v in rollout_flops(cfg, table).items()}
    staged = _stage_scoring(cfg, from_step)
    if staged is not None:
        s = cfg.sampling
        parts["rollout scoring"] = staged * s.batch_size * s.num_batches_per_epoch
    rows = lookup(table, "micro_step", wf_flops.micro_key(cfg))["rows"]
    try:
        parts["micro-steps"] = run_overhead(cfg, rows, from_step)["flops"]
    except KeyError as exc:  # the cadence needs a row the table has not counted
        raise wf_flops.Missing(str(exc.args[0])) from None
    return parts


def lora_params(cfg, table: dict) -> int:
    """The counted LoRA parameters of run `cfg`: its own shape's, else those of a counted shape
    of the same architecture and LoRA targets, scaled by rank. A LoRA's size is r x the sum of
    its targets' in + out features, whatever the batch, resolution, rewards, text length or
    dtypes, so a run at another batch or rank (paper-mini's) is sized exactly without a count
    of its own. Missing (naming the run's shape) when no such shape is counted."""
    key = wf_flops.micro_key(cfg)
    counted = table.get("micro_step") or {}
    if key in counted:
        return counted[key]["lora_params"]
    arch, _, _, lora = key.split("/")[:4]
    rank, _, targets = lora.partition(":")
    for other, row in counted.items():
        o_arch, _, _, o_lora = other.split("/")[:4]
        o_rank, _, o_targets = o_lora.partition(":")
        if (o_arch, o_targets) == (arch, targets) and "lora_params" in row:
            return row["lora_params"] * int(rank[1:]) // int(o_rank[1:])
    return lookup(table, "micro_step", key)["lora_params"]  # Missing: nothing of this model counted


def checkpoint_gb(cfg, table: dict) -> float:
    """GB of one checkpoint of run `cfg`: its counted LoRA parameters x CHECKPOINT_BYTES_PER_PARAM
    (the one size model: the plan's write time and the doctor's disk estimate)."""
    return lora_params(cfg, table) * CHECKPOINT_BYTES_PER_PARAM / 1e9


def checkpoint_seconds(cfg, table: dict, from_step: int = 0) -> tuple[float, int, float]:
    """(seconds, checkpoints, GB each) of the checkpoint writes after `from_step`."""
    t = cfg.train
    count = len({s for s in range(from_step + 1, t.max_steps + 1) if s % t.save_every == 0}
                | ({t.max_steps} if t.max_steps > from_step else set()))
    size = checkpoint_gb(cfg, table) * 1e9
    return count * size / CHECKPOINT_WRITE_BPS, count, size / 1e9


def eval_flops(row: dict, dataset: str, samples: int, mode: str, rewards: list[str],
               table: dict) -> dict[str, float]:
    """One evaluation job's FLOPs (`row`: marble.workflow.evaluation.row_protocol)."""
    arch = wf_flops.eval_arch(row, mode)
    spec, res = wf_flops.ARCHS[arch], row.get("resolution")
    if not res:
        raise wf_flops.Missing(f"eval row at the model's default resolution ({arch})")
    passes = 2 if spec.cfg_doubles and (row.get("guidance_scale") or 1.0) > 1.0 else 1
    forward = lookup(table, "forward", wf_flops.forward_key(arch, res, spec.eval_text_tokens))
    parts = {
        "generation": samples * row["num_inference_steps"] * passes * forward["flops"],
        "VAE decode": samples * lookup(table, "vae_decode", wf_flops.vae_key(spec.vae, res))["flops"],
        "text encoders": samples * sum(lookup(table, "encoder", e)["flops"] for e in spec.encoders),
        "scoring": samples * sum(wf_flops.scorer_flops(r) for r in rewards if r != wf_flops.JUDGE),
    }
    if wf_flops.JUDGE in rewards:
        parts["judge"] = samples * wf_flops.JUDGE_FLOPS
    return parts
