"""A training run end to end: validate, load, resume, step, checkpoint, evaluate, summarise.

`run_training` is what `marble train` calls; marble.training.trainer.Trainer holds the state
and runs one epoch; this module only orders the steps and writes train_summary.json.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from tqdm.auto import tqdm

from marble.config import RunConfig, to_dict
from marble.runtime import distributed as dist
from marble.runtime.io import write_json
from marble.runtime.machine import machine
from marble.runtime.provenance import write_provenance
from marble.training.checkpoint import latest_checkpoint
from marble.training.outcome import failed_run_reason
from marble.training.preflight import preflight
from marble.training.run_dir import TrainError, set_aside
from marble.training.stopping import StopRequest, stall_check
from marble.training.trainer import Trainer


def _last_values(records: list[dict], prefix: str) -> dict:
    """The last record's keys under `prefix` (empty without records)."""
    return {k: v for k, v in records[-1].items() if k.startswith(prefix)} if records else {}


def _train_loop(trainer: Trainer, cfg: RunConfig, progress: bool,
                stop: StopRequest) -> tuple[Path | None, bool]:
    """Resume, then step and checkpoint to max_steps; (resumed from, stopped early)."""
    resumed = trainer.resume()
    max_steps, every = cfg.train.max_steps, max(1, cfg.train.save_every)
    # A stop signal that came while the model loaded: nothing new to save (the newest
    # checkpoint is where a requeued or resubmitted job resumes), so stop before the first step.
    if trainer.step < max_steps and stop.agreed():
        return resumed, True
    def stop_after_evaluation() -> bool:
        """Evaluate when due; a stop that came during it (a paper evaluation takes minutes) is
        taken now, not one training step later. Every rank evaluates, so every rank asks."""
        return trainer.evaluate_if_due() is not None and stop.agreed() and trainer.step < max_steps

    bar = tqdm(total=max_steps, initial=trainer.step, desc="train", disable=not progress)
    # Step 0: the initial model (or a due step a requeue left); a stop here saves nothing new.
    requeue = stop_after_evaluation()
    while trainer.step < max_steps and not requeue:
        trainer.train_epoch()
        bar.update(1)
        # One tiny all-reduce per step, so every rank stops after the same step.
        requeue = stop.agreed() and trainer.step < max_steps
        saved = trainer.step % every == 0 or trainer.step == max_steps or requeue
        if saved:
            trainer.save()
        if requeue:
            break  # a due evaluation of this step runs after the resume
        if stop_after_evaluation():  # after the checkpoint: a crash here loses no step
            if not saved:
                trainer.save()
            requeue = True
    bar.close()
    if resumed is None and trainer.step == 0:
        trainer.save()  # max_steps 0: still leave a loadable checkpoint
    return resumed, requeue


def _resumed_step(resumed: Path | None) -> int:
    """The step a checkpoint folder holds (0: started from scratch)."""
    return int(Path(resumed).name.rsplit("-", 1)[-1]) if resumed else 0


def run_training(cfg: RunConfig, out_dir: str | Path, device: str | None = None,
                 progress: bool = True, stop: StopRequest | None = None, fresh: bool = False,
                 adopt: bool = False) -> dict:
    """Train (or resume) to cfg.train.max_steps; write DIR/train_summary.json; return it.

    SIGUSR1/SIGTERM stop the run early (marble.training.stopping): the step in flight finishes, a
    checkpoint is written, no train_summary.json, and the summary has `stopped: True`;
    `requeue: True` only for SIGUSR1 (the time-limit warning) and while the job progresses.
    `stop`: an already active StopRequest (`marble train` installs it before loading);
    without one the handlers are installed here, before the model loads.
    `fresh`: a run already in `out_dir` is renamed aside once all loaded (run_dir.set_aside).
    `adopt`: resume from a checkpoint of another run identity, or without one (`--adopt-checkpoint`).
    """
    out_dir = Path(out_dir)
    # Validate, then write: every input and the folder's identity (config and input
    # content) are checked before config.yaml is replaced (marble.training.preflight).
    inputs = preflight(cfg, out_dir, resume=not fresh, adopt=adopt)
    info = dist.init_distributed(device)
    start = time.perf_counter()
    with contextlib.ExitStack() as scope:
        if stop is None:
            stop = scope.enter_context(StopRequest())
        trainer = Trainer(cfg, out_dir, device=device, progress=progress, inputs=inputs, adopt=adopt)
        if info.is_main:  # once the model, table and rewards loaded: a failed start writes nothing
            if fresh and (aside := set_aside(out_dir)):  # before the ranks' resume collective
                print(f"marble train: --fresh: the run that was in {out_dir} is kept as {aside}")
            out_dir.mkdir(parents=True, exist_ok=True)
            trainer.write_identity_files()  # and again at every checkpoint
            write_provenance(out_dir, to_dict(cfg))  # this attempt's code and libraries
        try:
            resumed, requeue = _train_loop(trainer, cfg, progress and info.is_main, stop)
        finally:
            trainer.close()
    trainer.check_folder()  # a file lost after the last checkpoint: no summary of a damaged run
    last = latest_checkpoint(out_dir)
    summary = {
        "final_step": trainer.step, "epoch": trainer.epoch,
        "last_checkpoint": str(last) if last else None,
        "resumed_from": str(resumed) if resumed else None,
        "wall_time_s": time.perf_counter() - start, "world_size": info.world_size,
        # This attempt's CPU seconds since its process started (imports, loading, every
        # thread; a requeued run's earlier attempts are not in it): Snakemake's benchmark
        # samples its jobs every 30 s and misses most of a short one.
        "cpu_time_s": time.process_time(),
        "rank": info.rank,
        "machine": machine(),  # issue 47: the claim's answers can move with the CPU family
        "balancer": cfg.balancer.method, "final_rewards": _last_values(trainer.metrics.read(), "reward/"),
        "final_eval": _last_values(trainer.eval_log.read() if trainer.eval_log else [], "eval_reward/"),
        # stopped: ended before max_steps (a signal); requeue: only for the time-limit USR1,
        # never a SIGTERM (a cancel stays one), nor a job that keeps stopping without a step.
        "stopped": requeue, "stop_signal": stop.signal_name,
        "stall": dist.broadcast_object(stall_check(out_dir, _resumed_step(resumed), trainer.step)
                                       if info.is_main and requeue and not stop.cancelled else None),
    }
    summary["requeue"] = requeue and not stop.cancelled and not summary["stall"]
    # Every step skipped, or a reward NaN throughout: a failed run, no summary (all ranks raise).
    reason = dist.broadcast_object(failed_run_reason(trainer.metrics.read(), cfg.reward_names)
                                   if info.is_main and not requeue else None)
    if reason:
        raise TrainError(f"{out_dir}: {reason}; no train_summary.json written")
    if info.is_main and not requeue:  # the workflow's output: only for a finished run
        write_json(out_dir / "train_summary.json", summary)
    dist.barrier()
    dist.cleanup()
    return summary
