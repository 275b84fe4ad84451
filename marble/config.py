"""One typed configuration tree for training, rollouts, rewards and data.

Presets are named YAML files in `marble/presets/` (`tiny`, `rho_07`, ...). A preset may
name a `base:` preset it extends. User files and `--set key=value` overrides are merged
on top. Every key is checked against the dataclasses below: an unknown key or a value
of the wrong type is an error that names the key and where it came from, and so is a
number out of its range (marble.config_ranges: counts > 0, finite floats, ...). `--set`
keeps the text of string keys (`model.revision=0123456` stays "0123456").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from marble.config_balancers import BALANCERS
from marble.config_parse import ConfigError, build, merge, read_yaml
from marble.config_parse import declared_type as _declared_type
from marble.config_parse import parse_override as _parse_override
from marble.config_ranges import range_problem
from marble.config_stages import StageError, schedule_problem, stage_overlay, stage_problem

PRESET_DIR = Path(__file__).parent / "presets"

SD3_LORA_TARGETS = [
    "attn.add_k_proj", "attn.add_q_proj", "attn.add_v_proj", "attn.to_add_out",
    "attn.to_k", "attn.to_out.0", "attn.to_q", "attn.to_v",
]


@dataclass
class ModelConfig:
    # A hub id, a local diffusers folder, or `random:<size>` (tiny | sd35m): a random-init
    # model built in memory from configs, for benchmarks and tests without downloads.
    path: str = "stabilityai/stable-diffusion-3.5-medium"
    revision: str | None = None
    lora_rank: int = 32
    lora_alpha: int = 64
    lora_targets: list[str] = field(default_factory=lambda: list(SD3_LORA_TARGETS))
    # Autocast dtype of the forwards; fp16 adds a GradScaler (bf16 needs none).
    mixed_precision: Literal["no", "fp16", "bf16"] = "fp16"
    # Weights of the frozen base transformer. fp32 under fp16 autocast is the reference's
    # setup; SD3.5 Medium's 2.243 B parameters take 9.0 GB in fp32, 4.5 GB in fp16/bf16.
    base_dtype: Literal["fp32", "fp16", "bf16"] = "fp32"
    allow_tf32: bool = True  # TF32 matmuls on CUDA (reference `allow_tf32`)
    max_sequence_length: int = 128  # T5 tokens (docs/algorithm.md §2)


@dataclass
class SamplingConfig:
    solver: Literal["dpm2", "euler"] = "dpm2"
    num_steps: int = 25
    resolution: int = 512
    guidance_scale: float = 1.0
    images_per_prompt: int = 24  # k, the group size
    batch_size: int = 9  # per rank, per sampling batch
    num_batches_per_epoch: int = 8
    eval_num_steps: int = 40
    # The held-out evaluation's sampler (marble.training.heldout): the reference evaluates
    # with a deterministic Euler ODE (docs/algorithm.md §C), whatever the rollouts use.
    eval_solver: Literal["dpm2", "euler"] = "euler"


@dataclass
class TrainConfig:
    batch_size: int = 9  # per rank micro-batch
    timestep_fraction: float = 0.99
    nft_beta: float = 0.1  # beta of the implicit policies (docs/algorithm.md §4)
    kl_beta: float = 1e-4  # lambda_KL
    adv_clip: float = 5.0  # C
    lr: float = 3e-4
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    weight_decay: float = 1e-4
    adam_eps: float = 1e-8
    max_grad_norm: float = 1.0
    ema_decay: float = 0.9  # weight EMA, effective min((1+s)/(10+s), decay)
    old_decay_type: int = 1  # 0, 1 or 2 (docs/algorithm.md §5)
    old_decay_cap: float = 0.95  # MARBLE raised the type-1 cap from 0.5 to 0.95
    max_steps: int = 1000
    save_every: int = 30
    # Held-out evaluation of the EMA weights on data.test at step 0, every n steps and at the
    # last step, into RUN/eval.jsonl (marble.training.heldout); 0 = none. The reference: 10.
    eval_every: int = 0
    eval_images_per_prompt: int = 1  # fixed latents per (seed, prompt, repeat)
    eval_max_prompts: int | None = None  # None: the whole test split; n: n evenly spaced rows
    keep_checkpoints: int = 3  # newest complete checkpoints kept in RUN/checkpoints
    log_every: int = 1
    seed: int = 42
    # Device of the reward scorers that take one: `auto` = cuda:{LOCAL_RANK} when CUDA
    # is available, else cpu; or `cpu`, `cuda` (= cuda:{LOCAL_RANK}), `cuda:N`.
    reward_device: str = "auto"
    # The global images per optimizer step the preset reproduces (None: no reference); a run
    # whose ranks x batch x batches differ is refused unless allow_geometry_change
    # (marble.training.geometry).
    reference_images_per_step: int | None = None
    allow_geometry_change: bool = False


@dataclass
class BalancerConfig:
    method: str = "marble"  # a registered balancer (marble.config_balancers.BALANCERS; validate)
    # method gramian: the torchjd weighting solved on the Gram matrix, on MARBLE's schedule
    # (marble/balancers/weightings.py names them); its constructor options (e.g. {c: 0.5}).
    weighting: str | None = None
    weighting_options: dict[str, Any] = field(default_factory=dict)
    amortize_every: int = 10  # N: optimizer steps between full solves
    warmup_steps: int = 1  # every micro-step is a full solve before this step
    alpha_ema: float = 0.7  # rho
    fixed_alphas: list[float] | None = None  # equal_alpha: None means 1/K
    grad_eps: float = 1e-12
    # True (ours): amortized step backpropagates sum_k alpha_k L_k with masked L_k (exact).
    # False (the reference): combined advantage with nan -> 0, i.e. r = 1/2 fill
    # (docs/algorithm.md, "Masking modes"). Every preset states its choice: the paper
    # presets False, the tiny ones and the `rho_07_exact` ablation True.
    exact_masking: bool = True
    # Per-reward gradients and cosines on every n-th optimizer step, for every balancer (the
    # weighted sum too, so the report can compare); 0 = none, not even the cosines of full
    # solves (the reference logs none).
    diagnostics_every: int = 10
    # Which micro-steps of a diagnostic step are measured: `all` (the three levels of
    # marble/balancers/levels.py: every micro-step, the step's sum, the optimizer's update) or
    # `first` (micro-step 0 only, no step or update level: the paper presets' price, where
    # `all` at 192 micro-steps a step would add about 20% counted FLOPs to a run).
    diagnostics_micro: Literal["all", "first"] = "all"
    # Full solves: `retain` keeps one forward's graph for the K per-reward backward passes
    # (the reference); `recompute` runs one forward + backward per reward on the same
    # micro-batch instead: same gradients, no retained graph, a plain step's peak memory.
    full_solve: Literal["retain", "recompute"] = "retain"
    # Issue 37 (docs/balancers.md, "Fresh balancing at one backward's cost"); the defaults are
    # the reference's. `norm_corrected`: the amortized step applies alpha_k n_mean / |g_k|
    # (norms of the last solve), the solve's own direction, instead of alpha on raw gradients.
    cached_weights: Literal["reference", "norm_corrected"] = "reference"
    # `output`: MGDA-UB, the min-norm QP on the Gram of dL_k/dv (v the prediction) on every
    # micro-step and one backward (method marble only); `output_gradients` its normalisation.
    gram_space: Literal["parameters", "output"] = "parameters"
    output_gradients: Literal["unit", "raw"] = "unit"
    # method gramian: the weighting reads the Gram of unit gradients (`unit`, ours so far) or
    # of the raw ones, as the weightings' authors published them (`raw`, no rescale).
    zoo_gradients: Literal["unit", "raw"] = "unit"
    # Issue 46 (docs/balancers.md, "The exact fresh balance"): `exact` = a full solve on every
    # micro-step from per-sample gradients (method marble); `cached` = the reference's schedule.
    fresh: Literal["cached", "exact"] = "cached"


@dataclass
class RewardSpec:
    name: str = ""
    weight: float = 1.0  # used only by the weighted-sum average
    # Override the reward's content rule: apply only to prompts from these sources.
    applies_to: list[str] | None = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class DataConfig:
    train: str = "data/datasets/train.parquet"
    test: str = "data/datasets/test.parquet"
    embed_cache: str | None = None  # folder written by `marble data embed`
    stratified: bool = True
    # Prompt-plan seeds (marble.data.sampler.plan_seed): `keyed` (ours, the default) gives
    # every (seed, epoch) its own plan; `reference` is the reference's seed + epoch, where
    # seed s + 1 replays seed s one epoch late. The paper presets choose `reference`.
    sampler_seeds: Literal["keyed", "reference"] = "keyed"


@dataclass
class LoggingConfig:
    # metrics.jsonl is always written; the others are live trackers (marble/training/trackers.py),
    # optional extras: a missing one warns and training goes on.
    backends: list[Literal["jsonl", "tensorboard", "wandb", "dvclive"]] = field(
        default_factory=lambda: ["jsonl"])


@dataclass
class StageConfig:
    """One stage of a staged curriculum (marble.config_stages): the run with these replaced."""

    name: str = ""
    steps: int = 0  # optimizer steps of this stage
    sources: list[str] | None = None  # prompt sources of data.train (None: all)
    mix: list[float] | None = None  # share of each source per sampling batch (None: even)
    rewards: list[str] | None = None  # names from the run's `rewards` (None: all of them)
    balancer: dict[str, Any] | None = None  # `balancer` keys over the run's (None: the run's)
    lr: float | None = None  # None: train.lr


@dataclass
class RunConfig:
    preset: str = ""
    model: ModelConfig = field(default_factory=ModelConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    balancer: BalancerConfig = field(default_factory=BalancerConfig)
    rewards: list[RewardSpec] = field(default_factory=list)
    data: DataConfig = field(default_factory=DataConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    stages: list[StageConfig] = field(default_factory=list)  # empty: one stage, the run

    @property
    def reward_names(self) -> list[str]:
        return [r.name for r in self.rewards]


def available_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def preset_dict(name: str, _seen: tuple = ()) -> dict:
    """The raw dict of a preset with its `base:` chain resolved."""
    path = PRESET_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown preset `{name}` (available: {', '.join(available_presets())})")
    if name in _seen:
        raise ConfigError(f"preset `{name}`: circular `base:` chain {' -> '.join(_seen)}")
    data = read_yaml(path)
    base = data.pop("base", None)
    merged = merge(preset_dict(base, _seen + (name,)), data) if base else data
    merged["preset"] = name
    return merged


def declared_type(path: list[str], cls: type | None = None) -> Any:
    """The annotation of a dotted key in RunConfig (None where the path is not a plain field)."""
    return _declared_type(path, cls or RunConfig)


def parse_override(item: str) -> dict:
    """`a.b.c=value` -> {"a": {"b": {"c": value}}} (marble.config_parse.parse_override on RunConfig)."""
    return _parse_override(item, RunConfig)


def load_config(
    preset: str | None = None,
    files: list[str | Path] = (),
    overrides: list[str] = (),
) -> RunConfig:
    """Preset, then YAML files, then `key=value` overrides; validated as a whole."""
    data: dict = preset_dict(preset) if preset else {}
    for f in files:
        path = Path(f)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        file_data = read_yaml(path)
        if "base" in file_data:
            data = merge(preset_dict(file_data.pop("base")), data)
        data = merge(data, file_data)
    for item in overrides:
        data = merge(data, parse_override(item))
    origin = f"preset `{preset}`" if preset else "config"
    if files or overrides:
        origin += " + " + ", ".join([str(f) for f in files] + [f"--set {o}" for o in overrides])
    cfg = build(RunConfig, data, "", origin)
    validate(cfg, origin)
    for i in range(len(cfg.stages)):
        stage_config(cfg, i, origin)  # every stage is built and validated like a run
    if cfg.stages:
        problem = schedule_problem([s.name for s in cfg.stages], [s.steps for s in cfg.stages],
                                   cfg.train.max_steps)
        if problem:
            raise ConfigError(f"{origin}: {problem}")
    return cfg


def stage_config(cfg: RunConfig, index: int, origin: str = "config") -> RunConfig:
    """Stage `index` as a run config of its own (marble.config_stages.stage_overlay)."""
    stage = to_dict(cfg.stages[index])
    where = f"stages[{index}]"
    try:
        problem = stage_problem(stage, where)
        data = stage_overlay(to_dict(cfg), stage, where)
    except StageError as exc:
        problem = str(exc)
    if problem:
        raise ConfigError(f"{origin}: {problem}")
    origin = f"{origin}, {where} ({stage['name'] or 'unnamed'})"
    out = build(RunConfig, data, "", origin)
    validate(out, origin)
    return out


def validate(cfg: RunConfig, origin: str = "config") -> None:
    """Each key in its range (marble.config_ranges.RANGES), then the cross-field checks."""
    problem = range_problem(cfg)
    if problem:
        raise ConfigError(f"{origin}: {problem}")
    s, t, b = cfg.sampling, cfg.train, cfg.balancer
    names = cfg.reward_names
    if not names:
        raise ConfigError(f"{origin}: `rewards` is empty: name at least one reward")
    if len(set(names)) != len(names):
        raise ConfigError(f"{origin}: `rewards` names a reward twice: {names}")
    if (s.batch_size * s.num_batches_per_epoch) % t.batch_size:
        raise ConfigError(
            f"{origin}: `train.batch_size` ({t.batch_size}) must divide the rollouts per rank "
            f"per epoch (sampling.batch_size x sampling.num_batches_per_epoch = "
            f"{s.batch_size * s.num_batches_per_epoch})"
        )
    if b.method not in BALANCERS:  # the one list of methods: the balancers' descriptors
        raise ConfigError(f"{origin}: `balancer.method` = {b.method!r} is not one of {', '.join(BALANCERS)}")
    if (b.method == "gramian") != (b.weighting is not None) or (
            b.weighting_options and b.method != "gramian"):
        raise ConfigError(f"{origin}: `balancer.weighting` (and `weighting_options`) go with "
                          f"`balancer.method: gramian` and only with it (method "
                          f"{b.method!r}, weighting {b.weighting!r})")
    problem = fresh_balance_problem(b)
    if problem:
        raise ConfigError(f"{origin}: {problem}")
    if b.fixed_alphas is not None:
        if len(b.fixed_alphas) != len(names) or abs(sum(b.fixed_alphas) - 1) > 1e-6:
            raise ConfigError(
                f"{origin}: `balancer.fixed_alphas` needs {len(names)} values summing to 1"
            )
    if not any(r.weight > 0 for r in cfg.rewards):
        # the weighted mean divides by the weights' sum: all zero is NaN for every sample
        raise ConfigError(f"{origin}: every `rewards[].weight` is 0: at least one must be > 0")


def fresh_balance_problem(b: BalancerConfig) -> str | None:
    """The issue-37 options' pairings: each changes one method's step and no other's."""
    if b.gram_space == "output" and (b.method != "marble" or not b.exact_masking
                                     or b.cached_weights != "reference"):
        return ("`balancer.gram_space: output` goes with `method: marble`, `exact_masking: true` "
                f"and `cached_weights: reference` (got method {b.method!r}, exact_masking "
                f"{b.exact_masking}, cached_weights {b.cached_weights!r})")
    if b.output_gradients != "unit" and b.gram_space != "output":
        return "`balancer.output_gradients` goes with `balancer.gram_space: output`"
    if b.cached_weights == "norm_corrected" and b.method not in ("marble", "gramian"):
        return (f"`balancer.cached_weights: norm_corrected` needs a cached solve (method marble "
                f"or gramian), not method {b.method!r}")
    if b.fresh == "exact" and (b.method != "marble" or b.gram_space != "parameters"
                               or b.cached_weights != "reference" or b.full_solve != "retain"):
        return ("`balancer.fresh: exact` goes with `method: marble`, `gram_space: parameters`, "
                "`cached_weights: reference` and `full_solve: retain` (got method "
                f"{b.method!r}, gram_space {b.gram_space!r}, cached_weights "
                f"{b.cached_weights!r}, full_solve {b.full_solve!r})")
    if b.zoo_gradients != "unit" and b.method != "gramian":
        return "`balancer.zoo_gradients` goes with `balancer.method: gramian`"
    if b.zoo_gradients == "raw" and b.cached_weights == "norm_corrected":
        # raw weights already are what the amortized step applies: correcting them is wrong
        return "`balancer.zoo_gradients: raw` weights need no `cached_weights: norm_corrected`"
    return None


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def dump_yaml(cfg: RunConfig) -> str:
    data = to_dict(cfg)
    if not data["stages"]:
        del data["stages"]  # a run without stages writes the config.yaml it always has
    return yaml.safe_dump(data, sort_keys=False)


def training_timesteps(cfg: RunConfig) -> int:
    """T_train = floor(num_steps * timestep_fraction), at least 1 (docs/algorithm.md §4)."""
    return max(1, int(cfg.sampling.num_steps * cfg.train.timestep_fraction))


def grad_accumulation(cfg: RunConfig) -> int:
    """Micro-batches per optimizer step: one optimizer step per epoch (docs/algorithm.md §2)."""
    s = cfg.sampling
    return s.batch_size * s.num_batches_per_epoch // cfg.train.batch_size
