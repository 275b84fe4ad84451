"""Which steps and test items the held-out evaluation covers (marble.training.heldout):
pure and torch-free, so the GPU-hour plan (marble.workflow.cost) counts the same
evaluations the trainer runs."""

from __future__ import annotations


def heldout_rows(n_rows: int, max_prompts: int | None) -> list[int]:
    """The test rows evaluated: all, or `max_prompts` evenly spaced ones (first row kept),
    so a cap still spans every source of a table sorted by source."""
    if max_prompts is None or max_prompts >= n_rows:
        return list(range(n_rows))
    return sorted({int(i * n_rows / max_prompts) for i in range(max_prompts)})


def heldout_items(rows: list[int], images_per_prompt: int, rank: int, world: int) -> list[tuple]:
    """This rank's (row, repeat) pairs: the global list dealt round-robin over the ranks."""
    items = [(r, j) for r in rows for j in range(images_per_prompt)]
    return items[rank::world]


def due(step: int, every: int, max_steps: int) -> bool:
    """Evaluate at step 0, every `every` steps and at the last step (never when every = 0)."""
    return every > 0 and (step % every == 0 or step == max_steps)


def evaluated_steps(every: int, max_steps: int, from_step: int = 0) -> list[int]:
    """The steps a run evaluates from `from_step` on: a resumed run has already evaluated
    its checkpoint's step (eval.jsonl keeps it), a fresh one evaluates step 0 first."""
    first = 0 if from_step == 0 else from_step + 1
    return [s for s in range(first, max_steps + 1) if due(s, every, max_steps)]
