"""Stratified K-repeat sampler (docs/algorithm.md §2).

Per sampling iteration every rank computes the same global plan from (seed, epoch):
m = world_size * batch_size / k distinct prompts, split evenly over the sorted distinct
sources (remainder to the first ones) or drawn uniformly over all rows, each repeated k
times, shuffled, and cut into one batch_size chunk per rank. The shuffle spreads the k copies
of a prompt over the ranks (uniformly at random: with 4 ranks x 4 and k = 4 a prompt reaches
2.9 ranks on average, tests/test_data_sampler.py), and the ranks' chunks are disjoint and
cover the plan.

Seeds (`data.sampler_seeds`): `keyed` (the default) draws each plan from
`stable_seed(seed, STREAM_PROMPT_PLAN, epoch)` (marble/runtime/seeds.py), so no two
(seed, epoch) pairs share a plan; `reference` is the reference's `default_rng(seed + epoch)`,
under which seed s + 1's plan for epoch e is seed s's plan for epoch e + 1 (neighbouring
seeds are shifted copies, not independent draws). The paper presets choose `reference`.
"""

from __future__ import annotations

from typing import Iterator, Literal, Sequence

import numpy as np

from marble.config_stages import source_counts
from marble.runtime.seeds import STREAM_PROMPT_PLAN, stable_seed

SeedScheme = Literal["keyed", "reference"]
SEED_SCHEMES = ("keyed", "reference")


def plan_seed(seed: int, epoch: int, scheme: SeedScheme = "keyed") -> int:
    """The numpy seed of one iteration's plan (see the module docstring)."""
    if scheme == "keyed":
        return stable_seed(int(seed), STREAM_PROMPT_PLAN, int(epoch))
    if scheme == "reference":
        return int(seed) + int(epoch)
    raise ValueError(f"data.sampler_seeds must be one of {SEED_SCHEMES}, got {scheme!r}")


def per_source_counts(m: int, n_sources: int) -> list[int]:
    """m prompts split evenly over n sources; the remainder goes to the first sources."""
    base, rest = divmod(m, n_sources)
    return [base + (1 if i < rest else 0) for i in range(n_sources)]


class StratifiedKRepeatSampler:
    """Yields this rank's `batch_size` row indices for the current epoch value.

    Call `set_epoch(i)` before each sampling batch (the trainer passes
    epoch * num_batches_per_epoch + i, as the reference does); `__iter__` is endless and
    reads the epoch at every step, so it also works as a DataLoader `batch_sampler`.
    """

    def __init__(
        self,
        sources: Sequence[str],
        k: int,
        batch_size: int,
        world_size: int,
        rank: int,
        seed: int,
        stratified: bool = True,
        source_shares: dict[str, float] | None = None,
        seed_scheme: SeedScheme = "keyed",
    ):
        if k < 1 or batch_size < 1 or world_size < 1:
            raise ValueError(f"k={k}, batch_size={batch_size}, world_size={world_size} must be >= 1")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        total = world_size * batch_size
        if total % k:
            raise ValueError(
                f"world_size x batch_size = {total} is not divisible by k = {k}: "
                "each sampling iteration must hold whole groups of k images"
            )
        self.sources = [str(s) for s in sources]
        if not self.sources:
            raise ValueError("the sampler needs at least one row")
        self.k, self.batch_size, self.world_size, self.rank = k, batch_size, world_size, rank
        self.seed, self.stratified = int(seed), bool(stratified)
        plan_seed(self.seed, 0, seed_scheme)  # an unknown scheme fails here, not at step 1
        self.seed_scheme = seed_scheme
        self.m = total // k
        self.epoch = 0
        labels = np.asarray(self.sources)
        self.source_names = sorted(set(self.sources))
        self.rows_by_source = [np.flatnonzero(labels == s) for s in self.source_names]
        self.counts = (
            per_source_counts(self.m, len(self.source_names)) if self.stratified else [self.m]
        )
        if source_shares is not None:  # a stage's `mix`: shares instead of the even split
            if not self.stratified or set(source_shares) != set(self.source_names):
                raise ValueError(f"sampler: shares for {sorted(source_shares)} need stratified "
                                 f"sampling over exactly those sources ({self.source_names})")
            self.counts = source_counts(self.m, [source_shares[n] for n in self.source_names])
        pools = self.rows_by_source if self.stratified else [np.arange(len(self.sources))]
        for name, pool, n in zip(self.source_names if self.stratified else ["all"], pools, self.counts):
            if n > len(pool):
                raise ValueError(
                    f"sampler: {n} distinct prompts per iteration from source {name!r}, "
                    f"which has only {len(pool)} rows"
                )

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def global_plan(self, epoch: int | None = None) -> np.ndarray:
        """All ranks' indices for one iteration, shape [world_size, batch_size]."""
        epoch = self.epoch if epoch is None else int(epoch)
        # A Generator per call keeps it stateless (resume needs only the epoch).
        rng = np.random.default_rng(plan_seed(self.seed, epoch, self.seed_scheme))
        pools = self.rows_by_source if self.stratified else [np.arange(len(self.sources))]
        chosen = [pool[rng.permutation(len(pool))[:n]] for pool, n in zip(pools, self.counts)]
        prompts = np.concatenate(chosen)
        repeated = np.repeat(prompts, self.k)
        shuffled = repeated[rng.permutation(len(repeated))]
        return shuffled.reshape(self.world_size, self.batch_size)

    def batch(self, epoch: int | None = None) -> list[int]:
        return [int(i) for i in self.global_plan(epoch)[self.rank]]

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            yield self.batch()

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "seed": self.seed,
            "k": self.k,
            "batch_size": self.batch_size,
            "world_size": self.world_size,
            "stratified": self.stratified,
            "seed_scheme": self.seed_scheme,
            "num_rows": len(self.sources),
            "source_names": list(self.source_names),
        }

    def load_state_dict(self, state: dict) -> None:
        mine = self.state_dict()
        for key in ("seed", "k", "batch_size", "world_size", "stratified", "seed_scheme", "num_rows",
                    "source_names"):
            if key in state and state[key] != mine[key]:
                raise ValueError(
                    f"sampler state mismatch on {key!r}: checkpoint has {state[key]!r}, "
                    f"this run has {mine[key]!r}"
                )
        self.epoch = int(state["epoch"])
