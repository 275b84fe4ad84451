"""`marble train`: DiffusionNFT + a reward balancer, resumable, torchrun-aware.

    marble train --preset tiny --output-dir runs/tiny [--config FILE ...] [--max-steps N]
                 [--set key=value ...]
    torchrun --nproc_per_node 2 -m marble.train --preset tiny --output-dir runs/tiny

DIR/config.yaml holds the resolved config; a DIR that already has one must agree with
the requested config on every key that changes the result (marble.training.run_dir:
RESULT_NEUTRAL_KEYS lists the others), otherwise the run refuses to start rather than
silently mixing two experiments; DIR/inputs.json records what the inputs held (base model,
table, embedding cache, reward weights: marble.training.inputs), so an input replaced
under the same path is refused by name, and a moved project resumes; `--fresh` starts
over instead, the old run renamed aside (marble.training.run_dir.set_aside). Every input is read
and checked before the first file is written (marble.training.preflight): a failed start
leaves nothing that refuses the corrected command.
Errors are one line on stderr and exit status 2. SIGUSR1 (SLURM's time-limit warning) stops
the run after the current optimizer step with a checkpoint and exit status 75
(marble.training.stopping: EXIT_REQUEUE), which the SLURM wrapper turns into a requeue;
SIGTERM (scancel, preemption) checkpoints the same way and exits 143 (EXIT_CANCELLED), not
requeued; a job that requeues MAX_STALLED_ATTEMPTS times in a row without a step exits 1.
The handlers are installed first thing, so a signal during model loading also stops the
run (and writes no new checkpoint).
Global rank 0 holds the folder's TRAINING.lock while it trains (marble.training.run_lock;
under <project>/.marble/locks, where `dvc checkout` cannot remove it): a second trainer on
the same folder is refused (exit 2) while the first lives. A run whose every step was
skipped, or whose reward was NaN on every step, fails (exit 2, no train_summary.json).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from marble.config import ConfigError, RunConfig, load_config
from marble.runtime.io import file_problem
from marble.runtime.oserrors import describe_write_failure, print_write_failure
from marble.training import run_lock
from marble.training.checkpoint_format import checkpoint_name
from marble.training.preflight import preflight
from marble.training.run_dir import TrainError, check_run_dir  # noqa: F401 - re-exported for callers

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="marble train", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", required=True, help="named config in marble/presets (e.g. tiny)")
    p.add_argument("--output-dir", required=True, type=Path, help="run folder (resumes if present)")
    p.add_argument("--config", action="append", default=[], metavar="FILE",
                   help="YAML merged over the preset (repeatable)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="override one key, e.g. --set train.lr=1e-4 (repeatable)")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this optimizer step")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="force a device (default: cuda when available)")
    p.add_argument("--no-progress", action="store_true", help="hide the tqdm bars")
    p.add_argument("--fresh", action="store_true",
                   help="start over: a run already in --output-dir is renamed aside to "
                        ".<name>.replaced-<UTC time> (printed; nothing deleted) instead of resumed "
                        "or refused. For one start: a rerun with --fresh starts over again")
    p.add_argument("--adopt-checkpoint", action="store_true",
                   help="resume from the run folder's checkpoint although it records another run's "
                        "identity (config digest, base, table, seed) or none (a folder without "
                        "config.yaml/inputs.json, or from before identities): a deliberate warm start")
    return p


def resolve_config(args: argparse.Namespace) -> RunConfig:
    overrides = list(args.overrides)
    if args.max_steps is not None:
        overrides.append(f"train.max_steps={args.max_steps}")
    return load_config(args.preset, args.config, overrides)


def check_model_path(cfg: RunConfig) -> None:
    path = cfg.model.path
    if path.startswith("random:") or Path(path).is_dir():
        return
    if _HUB_ID.match(path) and not Path(path).exists():
        return  # a hub id: resolved (or refused offline) by from_pretrained
    raise TrainError(
        f"model folder not found: `model.path` = {path!r} (build the tiny model with "
        f"`marble models tiny --out {path}` or point model.path at a diffusers folder)"
    )


def check_data_path(cfg: RunConfig) -> None:
    problem = file_problem(cfg.data.train)  # a link loop or a folder, said as such
    if problem:
        said = problem if problem == "not found" else f"is {problem}"
        raise TrainError(
            f"training table {said}: `data.train` = {cfg.data.train!r} "
            f"(assemble it with `marble data assemble`)"
        )


def checkpoint_of_step(last_checkpoint: str | None, step: int) -> bool:
    """Whether the run's newest checkpoint is the one of `step` (step 0: a stop before any)."""
    return bool(last_checkpoint) and step > 0 and Path(last_checkpoint).name == checkpoint_name(step)


def check_balancer(cfg: RunConfig) -> None:
    """Build the balancer once before the model loads: a zoo balancer's missing package
    (torchjd), unknown weighting or bad options is one line and exit 2, not a traceback
    minutes later (ConfigError)."""
    from marble.balancers import build_balancer

    build_balancer(cfg.balancer, cfg.reward_names)


def _is_global_rank0() -> bool:
    # Before the process group exists: torchrun's RANK (absent for a plain run).
    return os.environ.get("RANK", "0") == "0"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from marble.training.stopping import StopRequest

    # Stop signals are flagged from here on: a SIGUSR1 (time limit) that arrives while torch,
    # the model and the rewards load ends with a requeue (exit 75), a SIGTERM with a clean
    # stop (143), not a kill.
    with StopRequest() as stop:
        lock = None
        try:
            cfg = resolve_config(args)
            check_model_path(cfg)
            check_data_path(cfg)
            check_balancer(cfg)
            # Every input read and the folder's identity checked before anything is written.
            preflight(cfg, args.output_dir, resume=not args.fresh, adopt=args.adopt_checkpoint)
            if _is_global_rank0():
                lock = run_lock.acquire(args.output_dir)
        except (ConfigError, TrainError, run_lock.RunLockError) as exc:
            print(f"marble train: error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        except OSError as exc:  # the lock is the first write: a read-only or full run folder
            print(f"marble train: error: {describe_write_failure(exc, args.output_dir) or exc}",
                  file=sys.stderr)
            raise SystemExit(2) from None
        try:
            summary = _train(args, cfg, stop)
        finally:
            if lock is not None:
                run_lock.release(lock)
    if summary.get("stopped"):
        return _stopped(summary)
    if summary.get("rank", 0) == 0:
        print(f"marble train: done at step {summary['final_step']} -> "
              f"{args.output_dir / 'train_summary.json'}")
    return 0


def _stopped(summary: dict) -> int:
    """Exit status (and rank 0's one line) of a run a signal stopped: USR1 -> requeue (75);
    SIGTERM -> stopped for good (143: a cancel stays one); a requeue storm -> error (1)."""
    from marble.training.stopping import EXIT_CANCELLED, EXIT_REQUEUE, write_requeue_file

    # A stop while the model loaded writes nothing: the log says so, never "with a checkpoint".
    saved = checkpoint_of_step(summary.get("last_checkpoint"), summary["final_step"])
    if summary.get("requeue"):
        write_requeue_file(summary["final_step"], summary.get("stop_signal"), saved)
        status, then = EXIT_REQUEUE, "(requeue)"
    elif summary.get("stall"):
        status, then = 1, f"(not requeued: {summary['stall']})"
    else:
        status, then = EXIT_CANCELLED, "(cancelled: not requeued; a new job resumes from here)"
    if summary.get("rank", 0) == 0:
        print(f"marble train: {summary.get('stop_signal')}: stopped after step {summary['final_step']} "
              f"{'with a checkpoint' if saved else '(no checkpoint of it: a new attempt starts there)'}; "
              f"exit {status} {then}", file=sys.stderr)
    return status


def _train(args: argparse.Namespace, cfg: RunConfig, stop) -> dict:
    from marble.data.embed_cache import EmbedCacheError
    from marble.models.loading import ModelNotFoundError
    from marble.training.checkpoint import CheckpointError
    from marble.training.run import run_training  # heavy imports only once the config is sound

    try:
        return run_training(cfg, args.output_dir, device=args.device,
                            progress=not args.no_progress, stop=stop, fresh=args.fresh,
                            adopt=args.adopt_checkpoint)
    except (TrainError, CheckpointError, EmbedCacheError, ModelNotFoundError) as exc:
        print(f"marble train: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except Exception as exc:  # noqa: BLE001 - re-raised unless it is a write failure
        # Disk full, read-only or forbidden run folder: the reason and the path, one line
        # (safetensors' errors are plain Exceptions, torch's RuntimeErrors).
        raise SystemExit(print_write_failure("marble train", exc, args.output_dir)) from None


if __name__ == "__main__":
    raise SystemExit(main())
