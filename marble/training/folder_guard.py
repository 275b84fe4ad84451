"""The run folder's guard, a part of `marble.training.trainer.Trainer`: the identity files
written at every checkpoint, and a stop (non-zero) when files the run wrote vanish under it
(`dvc checkout --force` of a persist output, a cleanup), leaving the folder whole again so
the rerun resumes. A mixin: it reads the trainer's folder, logs, checkpoints and rank."""

from __future__ import annotations

from marble.config import dump_yaml
from marble.rewards import user as user_rewards
from marble.runtime import distributed as dist
from marble.runtime.io import write_text
from marble.training.checkpoint import checkpoint_dir
from marble.training.inputs import write_inputs
from marble.training.run_dir import FRESH_HINT, TrainError


class FolderGuard:
    """Needs the trainer's `out_dir`, `cfg`, `inputs`, `watch` (run_dir.FolderWatch), `metrics`,
    `eval_log`, `info`, `step` and `checkpoints`."""

    def write_identity_files(self) -> None:
        """config.yaml and inputs.json (atomic; main rank): the run folder's identity."""
        write_text(self.out_dir / "config.yaml", dump_yaml(self.cfg))
        write_inputs(self.out_dir, self.inputs)
        user_rewards.record_in_run(self.out_dir)  # a config's own rewards: evaluation finds them here
        self.watch.expect("config", self.out_dir / "config.yaml")
        self.watch.expect("inputs", self.out_dir / "inputs.json")

    def _lost_files(self) -> list[str]:
        """What the run wrote and is gone (every rank gets rank 0's answer)."""
        for role, log in (("metrics", self.metrics), ("eval", self.eval_log)):
            if log is not None and log.enabled and log.path.is_file():
                self.watch.expect(role, log.path)
        return dist.broadcast_object(self.watch.lost() if self.info.is_main else None)

    def _stop_if_lost(self, lost: list[str]) -> None:
        """A folder that lost files under the run (`dvc checkout --force` of a persist output, a
        cleanup) has another history than this process: stop non-zero, leaving it whole again
        (identity files, this run's logs and the checkpoint just saved), so the rerun resumes."""
        if not lost:
            return
        if self.info.is_main:
            for log in (self.metrics, self.eval_log):
                if log is not None:
                    log.restore()
        raise TrainError(
            f"{self.out_dir}: {', '.join(lost)} deleted under the running trainer (another process "
            f"wrote to the run folder: `dvc checkout --force`?); stopped after step {self.step}, "
            f"whose checkpoint and logs are written back: rerun the same command to resume, or {FRESH_HINT}")

    def check_folder(self) -> None:
        """At the end of a run: a file lost since the last checkpoint stops it (no summary);
        the checkpoint of this step is written again when it went too (collective)."""
        lost = self._lost_files()
        if not lost:
            return
        gone = dist.broadcast_object(not checkpoint_dir(self.out_dir, self.step).is_dir()
                                     if self.info.is_main else None)
        if gone:
            self.checkpoints.save(self.step)
        if self.info.is_main:
            self.write_identity_files()
        self._stop_if_lost(lost)
