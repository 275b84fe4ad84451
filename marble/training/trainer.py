"""The DiffusionNFT optimisation loop with a reward balancer (docs/algorithm.md §8).

One optimizer step per epoch: G micro-batches x T_train timesteps, each a
`MicroStep` handed to the balancer, then all-reduce of .grad, clip, AdamW, weight EMA,
and at the end of the epoch the old-policy blend. Resume restores every piece of
state, so N steps straight equal k steps + resume + N-k steps bitwise on the CPU.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from marble.balancers import build_balancer
from marble.balancers.levels import StepLevels
from marble.config import RunConfig, grad_accumulation, training_timesteps
from marble.data import load_table
from marble.data.embed_cache import EmbeddingCache
from marble.data.sampler import StratifiedKRepeatSampler
from marble.maths.ema import WeightEMA, old_policy_decay
from marble.maths.flow import forward_process
from marble.models.lora import (
    AdapterStates,
    adapter_state,
    blend_adapter,
    save_lora_diffusers,
)
from marble.models.policy import load_policy
from marble.models.sampling import sigma_schedule
from marble.rewards import build_scorers, reward_device
from marble.runtime import distributed as dist
from marble.runtime.precision import (
    Precision,
    enable_tf32,
    make_precision,
    optimizer_update,
)
from marble.runtime.seeds import keyed_generator
from marble.training.checkpoint import (
    AttributeState,
    CheckpointManager,
    OptionalState,
    RNGState,
)
from marble.training.folder_guard import FolderGuard
from marble.training.geometry import check_geometry
from marble.training.heldout import HeldoutEvaluator, due
from marble.training.metrics import MetricsFileError, MetricsLog, StepAverager, logged_cadence
from marble.training.microstep import (
    MicroBatch,
    run_micro_step,
)
from marble.training.rollout import (
    STREAM_SHUFFLE,
    STREAM_TIMESTEPS,
    RolloutEngine,
    Rollouts,
)
from marble.training.inputs import current_inputs
from marble.training.run_dir import FRESH_HINT, FolderWatch, TrainError, run_identity
from marble.training.stages import CurrentState, StageSchedule, StageState

log = logging.getLogger(__name__)


def autocast_factory(mixed_precision: str, device: torch.device) -> Precision:
    """A zero-arg autocast context factory; fp16 also carries its GradScaler (`.scaler`)."""
    return make_precision(mixed_precision, device)


class Trainer(FolderGuard):
    """Owns the model, adapters, optimizer, EMA, balancer and sampler of one run."""

    def __init__(self, cfg: RunConfig, out_dir: str | Path, device: str | None = None,
                 progress: bool = True, inputs: dict | None = None, adopt: bool = False):
        """`inputs`: the inputs' fingerprints preflight returned (computed here when None);
        they make the run identity every checkpoint records. `adopt`: --adopt-checkpoint."""
        self.cfg, self.out_dir, self.progress = cfg, Path(out_dir), progress
        self.inputs = inputs if inputs is not None else current_inputs(cfg)
        self.watch = FolderWatch(self.out_dir)
        self.info = dist.init_distributed(device)
        dev = self.info.device
        t, m, s = cfg.train, cfg.model, cfg.sampling
        geometry = check_geometry(self.info.world_size, s, t)  # refuses a silent change of batch
        if self.info.is_main:
            print(geometry, flush=True)
        enable_tf32(dev, m.allow_tf32)
        # Base transformer in model.base_dtype (fp32 by default, as the reference), text
        # encoders in the autocast dtype, not loaded at all when the embedding cache
        # serves the prompts; LoRA in fp32 (marble.models.policy, shared with the bench).
        self.pipe, self.params = load_policy(m, t.seed, dev, text_encoders=not cfg.data.embed_cache)
        self.optimizer = torch.optim.AdamW(self.params, lr=t.lr, betas=tuple(t.adam_betas),
                                           weight_decay=t.weight_decay, eps=t.adam_eps)
        self.ema = WeightEMA(self.params, max_decay=t.ema_decay)
        self.precision: Precision = make_precision(m.mixed_precision, dev)
        self.scaler = self.precision.scaler  # fp16 only
        self.autocast = self.precision
        self.table = load_table(cfg.data.train)
        self.sigmas = sigma_schedule(self.pipe.scheduler, s.num_steps).to(dev, torch.float32)
        self.reward_device = reward_device(t.reward_device, self.info.local_rank,
                                           cuda=dev.type == "cuda")
        # Stage-owned pieces (sampler, scorers, balancer, lr) come from _enter_stage.
        self.schedule, self.stage, self.rollouts = StageSchedule(cfg), None, None
        self.scorers: dict = {}  # built once per reward, shared by the stages that use it
        self.embed_cache = self._embed_cache()
        for index in range(len(self.schedule.configs)):
            # Every stage's prompts checked now: a bad later stage fails here in one line,
            # not at its boundary hours into the run (samplers are cheap and draw no RNG).
            self._stage_sampler(index)
        self._enter_stage(0)
        self.metrics = MetricsLog(self.out_dir / "metrics.jsonl", enabled=self.info.is_main,
                                  backends=cfg.logging.backends)
        self.heldout, self.eval_log, self.evaluated = self._heldout(), None, set()
        if self.heldout is not None:
            self.eval_log = MetricsLog(self.out_dir / "eval.jsonl", enabled=self.info.is_main)
        self.step, self.epoch = 0, 0
        self.checkpoints = CheckpointManager(
            self.out_dir, self._checkpoint_states(), write_lora=self._write_ema_lora,
            keep=t.keep_checkpoints, is_main=self.info.is_main,
            identity=run_identity(cfg, self.inputs), adopt=adopt)

    def _checkpoint_states(self) -> dict:
        """Everything a resume restores, by name: one line per piece of state (the manager
        refuses a checkpoint that lacks one, so none can be forgotten)."""
        states = {
            "adapters": AdapterStates(self.pipe.transformer),  # online "default" and "old"
            "optimizer": self.optimizer,
            "step": AttributeState(self, "step"),
            "epoch": AttributeState(self, "epoch"),
            # The stage's own objects (a boundary replaces them): whichever the trainer holds.
            "sampler": CurrentState(self, "sampler"),
            "balancer": CurrentState(self, "balancer"),
            "ema": self.ema,
            "scaler": OptionalState(self.scaler, "fp16 GradScaler"),
            "rng": RNGState(),
        }
        if self.schedule.staged:
            # Restored first (dicts keep order): it enters the stage whose sampler and
            # balancer the checkpoint holds. A run without stages saves no stage key.
            states = {"stage": StageState(self.schedule, lambda: self.stage, self._enter_stage),
                      **states}
        return states

    def _enter_stage(self, index: int) -> None:
        """Build what stage `index` owns; the optimizer, EMA and adapters carry over."""
        if index == self.stage:
            return
        cfg = self.schedule.config(index)
        if self.rollouts is not None:
            self.rollouts.close()
        table, self.sampler = self._stage_sampler(index)
        # fresh: a new reward set; the seed keys a weighting's own draws (zoo_random)
        self.balancer = build_balancer(cfg.balancer, cfg.reward_names, seed=cfg.train.seed)
        missing = [spec for spec in cfg.rewards if spec.name not in self.scorers]
        self.scorers.update(build_scorers(missing, self.reward_device))
        self.rollouts = RolloutEngine(self.pipe, cfg, table,
                                      {r.name: self.scorers[r.name] for r in cfg.rewards},
                                      self.sampler, self.sigmas, self.info, self.autocast,
                                      self.embed_cache, self.progress,
                                      reward_device=self.reward_device)
        for group in self.optimizer.param_groups:
            group["lr"] = cfg.train.lr
        self.stage, self.stage_cfg = index, cfg

    def _stage_sampler(self, index: int) -> tuple:
        """Stage `index`'s prompt rows and sampler; a TrainError naming the stage when its
        sources cannot fill a sampling batch (`marble train` prints it as one line)."""
        cfg, s = self.schedule.config(index), self.cfg.sampling
        table = self.schedule.table(self.table, index)
        try:
            return table, StratifiedKRepeatSampler(
                table["source"].tolist(), k=s.images_per_prompt, batch_size=s.batch_size,
                world_size=self.info.world_size, rank=self.info.rank, seed=self.cfg.train.seed,
                stratified=cfg.data.stratified, source_shares=self.schedule.shares(index),
                seed_scheme=cfg.data.sampler_seeds)
        except ValueError as exc:
            where = f"stage {self.schedule.name(index)!r}: " if self.schedule.staged else ""
            raise TrainError(f"{where}{exc}") from None

    def _heldout(self) -> HeldoutEvaluator | None:
        """The held-out evaluator when train.eval_every > 0: every reward of the run (a stage
        may train on fewer), on data.test, through the rollouts' prompt embedding."""
        if self.cfg.train.eval_every == 0:
            return None
        missing = [spec for spec in self.cfg.rewards if spec.name not in self.scorers]
        self.scorers.update(build_scorers(missing, self.reward_device))
        return HeldoutEvaluator(self.pipe, self.cfg, load_table(self.cfg.data.test), self.scorers,
                                lambda prompts: self.rollouts.embed(prompts), self.info,
                                self.autocast, self.reward_device)

    def evaluate_if_due(self) -> dict | None:
        """The held-out evaluation of this step, unless off, not due or already in eval.jsonl."""
        t = self.cfg.train
        if self.heldout is None or not due(self.step, t.eval_every, t.max_steps) \
                or self.step in self.evaluated:
            return None
        record = self.heldout.evaluate(self.step, self.ema)
        self.eval_log.log(record)
        self.evaluated.add(self.step)
        return record

    def _embed_cache(self):
        if not self.cfg.data.embed_cache:
            return None

        return EmbeddingCache(self.cfg.data.embed_cache)

    # ------------------------------------------------------------ state

    def _write_ema_lora(self, folder: Path) -> None:
        """The checkpoint's diffusers-format export: the EMA weights of "default"."""
        with self.ema.swapped():
            ema_state = adapter_state(self.pipe.transformer, "default")
        save_lora_diffusers(self.pipe.transformer, folder, "default", ema_state,
                            provenance=self.checkpoints.identity)

    def save(self) -> Path:
        """Checkpoint on the main rank (all ranks hold identical state); others wait. The
        identity files first, again: a restore that replaced or removed them is undone at once.
        A file lost under the run since the last checkpoint stops it, after this checkpoint."""
        lost = self._lost_files()
        if self.info.is_main:  # before the checkpoint: its marker vouches that they are written
            self.write_identity_files()
        path = self.checkpoints.save(self.step)
        if self.info.is_main:
            self.watch.expect("checkpoint", path)
        self._stop_if_lost(lost)
        return path

    def resume(self) -> Path | None:
        """Restore every registered state from the newest intact checkpoint, if any."""
        path = self.checkpoints.resume()
        if path is not None:
            self._check_records()
        # No checkpoint yet: lines an earlier attempt logged are steps no one will resume
        # from (they would be logged twice).
        self.metrics.truncate_after(0 if path is None else self.step)
        if self.eval_log is not None:
            # Evaluations up to the checkpoint's step stay (not repeated); later ones go.
            self.eval_log.truncate_after(-1 if path is None else self.step)
            # Every rank must agree on which evaluations run (they are collective).
            self.evaluated = dist.broadcast_object({r["step"] for r in self.eval_log.read()}
                                                   if self.info.is_main else None)
        return path

    def _check_records(self) -> None:
        """The logs this resume extends are the run's own (MetricsLog.check_record); every rank
        gets rank 0's verdict, so all stop together (exit 2) instead of waiting on rank 0."""
        problem = None
        if self.info.is_main:
            problem = self.metrics.check_record(
                self.step, logged_cadence(self.out_dir, self.cfg.train.log_every))
            if problem is None and self.eval_log is not None:
                problem = self.eval_log.check_record(self.step)
        problem = dist.broadcast_object(problem)
        if problem:
            raise MetricsFileError(f"{problem}; restore the file, or use {FRESH_HINT}")

    # ------------------------------------------------------------ one epoch

    def train_epoch(self) -> dict:
        t0 = time.perf_counter()
        self._enter_stage(self.schedule.index(self.step))  # a boundary: the next stage's pieces
        ro = self.rollouts.collect(self.epoch)
        # Means over micro-steps: `full_solve` is the fraction of micro-steps that solved;
        # alpha/* keep the last value (the weights in force after the step).
        averager = StepAverager()
        levels = self._optimize(ro, averager)
        record = {"step": self.step, "epoch": self.epoch, "balancer": self.stage_cfg.balancer.method,
                  **self.schedule.record(self.stage)}
        record.update(ro.metrics)
        step_metrics = averager.result()
        loss_keys = sorted(k for k in step_metrics if k.startswith("loss/"))
        if loss_keys and self.info.world_size > 1:  # per-rank losses -> global means
            values = torch.tensor([step_metrics[k] for k in loss_keys], dtype=torch.float64,
                                  device=self.info.device)
            means = dist.all_reduce_mean_(values)
            step_metrics.update(zip(loss_keys, means.tolist()))
        record.update(step_metrics)
        record.update(levels)  # the three cosine levels of a diagnostic step (issue 36)
        record["time/step_s"] = time.perf_counter() - t0
        decay = old_policy_decay(self.step, self.cfg.train.old_decay_type,
                                 self.cfg.train.old_decay_cap)

        blend_adapter(self.pipe.transformer, dst="old", src="default", decay=decay)
        record["old_decay"] = decay
        self.epoch += 1
        if self.step % max(1, self.cfg.train.log_every) == 0:
            self.metrics.log(record)
        return record

    def _per_sample_draws(self, global_index: list[int], n_t: int, shape) -> tuple:
        """Per sample: a T_train subset of the sigma grid (docs/algorithm.md §4) and fresh noise.

        Keyed by the sample's global position, so a sample gets the same draws on any
        number of ranks and whichever micro-batch it lands in. On the CPU the noise
        continues the timestep generator (as it always has); on a GPU it is drawn on the
        device from a device generator with the same key (no pageable host copy per
        micro-batch; deterministic, so a resume stays bitwise).
        """
        seed, num_steps, dev = self.cfg.train.seed, self.cfg.sampling.num_steps, self.info.device
        tsel, noise = [], []
        for gidx in global_index:
            gen = keyed_generator(seed, STREAM_TIMESTEPS, self.epoch, gidx)
            tsel.append(torch.randperm(num_steps, generator=gen)[:n_t])
            if dev.type != "cpu":
                gen = keyed_generator(seed, STREAM_TIMESTEPS, self.epoch, gidx, device=dev)
            noise.append(torch.randn((n_t, *shape), generator=gen, device=gen.device))
        return torch.stack(tsel).to(dev), torch.stack(noise).to(dev)

    def _micro_step(self, ro: Rollouts, idx, present, t_index, eps, scale: float,
                    micro: int) -> dict:
        """One micro-step: metrics stay device scalars (read once, at the step's end)."""
        x0, sig = ro.x0[idx], self.sigmas[t_index]
        batch = MicroBatch(x0=x0, x_t=forward_process(x0, eps, sig), sigma=sig,
                           prompt_embeds=ro.prompt_embeds[idx], pooled=ro.pooled[idx],
                           advantages=ro.advantages[idx], avg_advantage=ro.avg_advantage[idx],
                           reward_present=present)
        return run_micro_step(self.pipe.transformer, batch, self.cfg.train, self.params,
                              self.autocast, self.balancer, scale=scale,
                              global_step=self.step, micro_index=micro,
                              grad_scaler=self.scaler)

    def _optimize(self, ro: Rollouts, averager: StepAverager) -> dict:
        """Every micro-step's backward, then the optimizer step; returns the step's cosine
        levels on a diagnostic step (marble/balancers/levels.py), else {}."""
        t = self.cfg.train
        n, bsz = len(ro), t.batch_size
        n_micro, n_t = n // bsz, training_timesteps(self.cfg)
        if n_micro != grad_accumulation(self.cfg):
            raise RuntimeError(f"{n} rollouts on this rank do not make "
                               f"{grad_accumulation(self.cfg)} micro-batches of {bsz}")
        scale = 1.0 / (n_micro * n_t)
        perm = torch.randperm(n, generator=keyed_generator(t.seed, STREAM_SHUFFLE, self.epoch,
                                                           self.info.rank))
        # Host copies read once per optimizer step, not per micro-step: which rewards each
        # sample has (a full solve skips absent ones) and the samples' global positions.
        finite = np.isfinite(ro.advantages.detach().cpu().numpy())
        global_index = ro.global_index.cpu().numpy()
        bar = tqdm(total=n_micro * n_t, desc=f"step {self.step}", leave=False,
                   disable=not (self.progress and self.info.is_main))
        hidden = 0.0  # gradient entries a balancer zeroed (full solves): still an overflow
        # Cost only where asked: the step-level sums exist on diagnostic steps alone.
        self.balancer.levels = (StepLevels(self.balancer.reward_names, self.step)
                                if self.balancer.measures_levels(self.step) else None)
        for g in range(n_micro):
            rows = perm[g * bsz:(g + 1) * bsz].numpy()
            idx = torch.from_numpy(rows).to(self.info.device)
            present = tuple(bool(x) for x in finite[rows].any(0))
            t_sel, noise = self._per_sample_draws([int(i) for i in global_index[rows]], n_t,
                                                  tuple(ro.x0.shape[1:]))
            for j in range(n_t):
                metrics = self._micro_step(ro, idx, present, t_sel[:, j], noise[:, j], scale,
                                           g * n_t + j)
                hidden = hidden + metrics.get("nonfinite_grad_entries", 0.0)
                averager.add(metrics)
                bar.update(1)
        bar.close()
        levels, self.balancer.levels = self.balancer.levels, None
        if levels is None:
            averager.add(self._apply_update(hidden))
            return {}
        before = torch.cat([p.detach().reshape(-1).double() for p in self.params])
        averager.add(self._apply_update(hidden))
        after = torch.cat([p.detach().reshape(-1).double() for p in self.params])
        return levels.result(before.sub_(after))  # -(change): the gradient-like direction

    def _apply_update(self, hidden_nonfinite: float = 0.0) -> dict:
        """Optimizer step (or a skip on any rank's overflow), then the weight EMA.

        Like the reference, a skipped step still counts and the EMA still updates, with
        the decay of the post-increment step (min((1+s)/(10+s), 0.9), s = 1 first).
        """
        out = optimizer_update(self.params, self.optimizer, self.precision,
                               self.cfg.train.max_grad_norm, hidden_nonfinite)
        self.step += 1
        out["ema_decay"] = self.ema.update(self.step)
        if self.info.device.type == "cuda":
            out["memory/peak_gb"] = torch.cuda.max_memory_allocated(self.info.device) / 2**30
        return out

    def close(self) -> None:
        self.rollouts.close()
        if self.heldout is not None:
            self.heldout.close()
