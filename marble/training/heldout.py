"""Held-out evaluation during training: the reference's in-training eval (docs/algorithm.md §C).

Every `train.eval_every` optimizer steps, at step 0 and at the last step, the EMA weights
generate images for the test split (`data.test`; `train.eval_max_prompts` evenly spaced
rows of it, `train.eval_images_per_prompt` images each) with `sampling.eval_solver` in
`sampling.eval_num_steps` steps, and every reward of the run scores the prompts it applies
to; the means go to RUN/eval.jsonl, one line per evaluated step:

    {"step": s, "eval_reward/<r>": mean, "eval_applicable/<r>": n, "eval_nan/<r>": n_nan, ...}

Why fixed noise: an image's initial latent is keyed by (seed, stream, test row, repeat) and
nothing else, so every evaluation of a run, and every run of the same seed (whatever its
balancer), draws the same latents for the same prompts. A change between two evaluations, or
between two balancers at one seed, is then the model's alone, not a new draw of prompts and
noise: the claim experiment's paired comparisons rest on this (docs/claim.md).

It touches no random state of training (own generators) and restores the online weights
after the EMA swap, so a run with evaluation trains bitwise as one without; so its settings
may change on resume (marble.training.run_dir.RESULT_NEUTRAL_KEYS). What they measure is
recorded instead: every line carries `eval_id`, a digest of the test table's content and
the evaluation's settings, and a change between two evaluations of different ids is no
change (marble.report.run_measures.eval_change refuses it).
"""

from __future__ import annotations

import json
import time

import pandas as pd
import torch

from marble.models.encode import decode_latents, latent_shape
from marble.models.lora import use_adapter
from marble.models.sampling import sample_latents, sigma_schedule
from marble.runtime import distributed as dist
from marble.runtime.fingerprint import fingerprint
from marble.runtime.seeds import keyed_generator, stable_seed
from marble.training.heldout_schedule import due, heldout_items, heldout_rows
from marble.training.rollout import RewardScorer, applicable_mask, table_masks

__all__ = ["HeldoutEvaluator", "due", "eval_record", "heldout_items", "heldout_rows"]

STREAM_HELDOUT = 7  # the stream of the held-out images' latents (1-3: rollout.py, 4-6: seeds.py)


def eval_identity(cfg, test_fingerprint: str) -> str:
    """What an evaluation measures, as 16 hex digits: the test table's content and every
    setting that changes the images or the scores (not the training's)."""
    s, t = cfg.sampling, cfg.train
    key = [test_fingerprint, s.eval_num_steps, s.eval_solver, s.resolution, s.guidance_scale,
           t.eval_images_per_prompt, t.eval_max_prompts, t.seed, cfg.model.mixed_precision,
           *[f"{r.name}:{sorted((r.options or {}).items())}:{r.applies_to}" for r in cfg.rewards]]
    return f"{stable_seed(*map(str, key)):016x}"


def eval_record(names: list[str], totals: torch.Tensor) -> dict:
    """The eval.jsonl fields from the summed [3, K] (score sums, scored counts, NaN counts)."""
    out = {}
    for k, name in enumerate(names):
        total, scored, nan = (float(totals[i, k]) for i in range(3))
        out[f"eval_reward/{name}"] = total / scored if scored else float("nan")
        out[f"eval_applicable/{name}"] = int(scored + nan)
        out[f"eval_nan/{name}"] = int(nan)
    return out


class HeldoutEvaluator:
    """Generates and scores the held-out images of one run (see the module docstring)."""

    def __init__(self, pipe, cfg, table: pd.DataFrame, scorers: dict, embed, info, autocast,
                 reward_device: str = "cpu"):
        self.pipe, self.cfg, self.table, self.info = pipe, cfg, table, info
        self.embed, self.autocast = embed, autocast
        self.names = cfg.reward_names
        self.metadata = [json.loads(m) if isinstance(m, str) else dict(m or {})
                         for m in table["metadata"]]
        self.scorer = RewardScorer({n: scorers[n] for n in self.names},
                                   table_masks(table, self.names), reward_device)
        s, t = cfg.sampling, cfg.train
        self.sigmas = sigma_schedule(pipe.scheduler, s.eval_num_steps).to(info.device, torch.float32)
        rows = heldout_rows(len(table), t.eval_max_prompts)
        self.items = heldout_items(rows, t.eval_images_per_prompt, info.rank, info.world_size)
        self.eval_id = eval_identity(cfg, fingerprint(cfg.data.test))

    def _noise(self, items: list[tuple], shape: tuple) -> torch.Tensor:
        seed = self.cfg.train.seed
        return torch.stack([torch.randn(shape, generator=keyed_generator(seed, STREAM_HELDOUT,
                                                                          row, j))
                            for row, j in items])

    @torch.no_grad()
    def _scores(self) -> tuple[torch.Tensor, torch.Tensor]:
        """[n, K] scores of this rank's items (NaN where a reward does not apply) and their rows."""
        s = self.cfg.sampling
        shape = tuple(latent_shape(self.pipe, s.resolution))
        futures, all_rows = [], []
        for start in range(0, len(self.items), s.batch_size):
            batch = self.items[start:start + s.batch_size]
            rows = [r for r, _ in batch]
            prompts = [self.table["prompt"].iat[r] for r in rows]
            embeds, pooled = self.embed(prompts)
            noise = self._noise(batch, shape).to(self.info.device, torch.float32)
            with use_adapter(self.pipe.transformer, "default"), self.autocast():
                x0 = sample_latents(self.pipe.transformer, noise, embeds, pooled, self.sigmas,
                                    s.eval_solver, guidance_scale=s.guidance_scale)
                images = decode_latents(self.pipe, x0.float()).float().cpu()
            futures.append(self.scorer.submit(images, prompts, [self.metadata[r] for r in rows],
                                              rows))
            all_rows += rows
        if not futures:
            return torch.zeros(0, len(self.names)), torch.zeros(0, dtype=torch.long)
        scores = torch.stack([torch.cat([f[k].result() for f in futures])
                              for k in range(len(self.names))], dim=1)
        return scores, torch.as_tensor(all_rows, dtype=torch.long)

    def evaluate(self, step: int, ema) -> dict:
        """The eval.jsonl record of `step`: the EMA weights swapped in, every rank's sums reduced."""
        start = time.perf_counter()
        with ema.swapped():
            scores, rows = self._scores()
        applicable = applicable_mask(self.table, self.names, rows, scores).double()
        finite = torch.isfinite(scores)
        totals = torch.stack([torch.where(finite, scores.double(), 0.0).sum(0),
                              (applicable * finite).sum(0),
                              (applicable * ~finite).sum(0)])
        totals = dist.all_reduce_sum_(totals.to(self.info.device)).cpu()
        record = {"step": step, "eval_id": self.eval_id, **eval_record(self.names, totals)}
        record["time/eval_s"] = time.perf_counter() - start
        return record

    def close(self) -> None:
        self.scorer.close()
