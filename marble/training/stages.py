"""A staged curriculum in the trainer: which stage trains a step, and what a stage trains on.

The schedule is the run's `stages:` (marble.config_stages); a run without stages is one stage,
the run itself, and everything here is then the identity: the whole table, the run's config,
no stage key in checkpoints or metrics (such a run is bit-for-bit what it was before stages).

At a boundary the trainer rebuilds what a stage owns (its prompt rows and sampler, its reward
scorers and masks, a fresh balancer for its reward set, its learning rate) and keeps what the
run owns (the adapters, the optimizer's moments, the weight EMA, the old policy, the RNG
streams keyed by epoch). A checkpoint records the stage its balancer and sampler belong to
(`StageState`, registered with the checkpoint manager before them), so resume restores them
into that stage and the next step switches exactly where the uninterrupted run switched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd

from marble.config import RunConfig, stage_config
from marble.config_stages import stage_index, stage_starts
from marble.training.run_dir import TrainError


class StageSchedule:
    """The stages of one run and the pieces of each that the trainer builds from."""

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.lengths = [s.steps for s in cfg.stages]
        self.starts = stage_starts(self.lengths)
        # Validated at load (marble.config.load_config); built once here, reused at every switch.
        self.configs = [stage_config(cfg, i) for i in range(len(cfg.stages))] or [cfg]

    @property
    def staged(self) -> bool:
        return bool(self.lengths)

    def index(self, step: int) -> int:
        """The stage that trains the step taken when the trainer's counter reads `step`."""
        return stage_index(step, self.lengths)

    def config(self, index: int) -> RunConfig:
        return self.configs[index]

    def name(self, index: int) -> str:
        return self.cfg.stages[index].name if self.staged else ""

    def table(self, table: pd.DataFrame, index: int) -> pd.DataFrame:
        """The prompt rows stage `index` draws from: its sources' rows (all rows without any)."""
        sources = self.cfg.stages[index].sources if self.staged else None
        if sources is None:
            return table
        have = set(table["source"])
        missing = [s for s in sources if s not in have]
        if missing:
            # TrainError: `marble train` prints it as one line (the table is known only here).
            raise TrainError(f"stage {self.name(index)!r}: `sources` {missing} have no rows in "
                             f"{self.cfg.data.train} (its sources: {sorted(have)})")
        return table[table["source"].isin(sources)].reset_index(drop=True)

    def shares(self, index: int) -> dict[str, float] | None:
        """{source: share of a sampling batch's prompts}, or None (the sampler's even split)."""
        stage = self.cfg.stages[index] if self.staged else None
        if stage is None or stage.mix is None:
            return None
        return dict(zip(stage.sources, stage.mix))

    def record(self, index: int) -> dict:
        """The stage keys of a metrics record (none for a run without stages)."""
        return {"stage": index, "stage_name": self.name(index)} if self.staged else {}

    def checkpoint_state(self, index: int) -> dict:
        """The stage piece of state.pt."""
        return {"index": index, "name": self.name(index), "start_step": self.starts[index],
                "steps": self.lengths[index]}

    def resumed_index(self, saved: dict) -> int:
        """The stage a checkpoint's balancer and sampler belong to; its name must match."""
        index = int(saved["index"])
        if not self.staged or index >= len(self.lengths) or saved["name"] != self.name(index):
            raise ValueError(f"the checkpoint is in stage {saved['name']!r} (#{index}), "
                             f"which this run's `stages` do not have there")
        return index


class StageState:
    """The stage as a checkpoint state (marble.training.checkpoint.CheckpointManager): saves
    the stage in force; restoring enters it, so it is registered before the stage's sampler
    and balancer, which then load into that stage's objects."""

    def __init__(self, schedule: StageSchedule, current: Callable[[], int],
                 enter: Callable[[int], None]):
        self.schedule, self.current, self.enter = schedule, current, enter

    def state_dict(self) -> dict:
        return self.schedule.checkpoint_state(self.current())

    def load_state_dict(self, saved: dict) -> None:
        self.enter(self.schedule.resumed_index(saved))


class CurrentState:
    """The state of whatever object `owner.<name>` holds now (a stage's sampler or balancer,
    replaced at each boundary), so the registry never keeps a stale one."""

    def __init__(self, owner: object, name: str):
        self.owner, self.name = owner, name

    def state_dict(self) -> Any:
        return getattr(self.owner, self.name).state_dict()

    def load_state_dict(self, value: Any) -> Any:
        return getattr(self.owner, self.name).load_state_dict(value)
