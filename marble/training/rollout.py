"""One epoch of rollouts: stratified prompts -> old-policy samples -> rewards -> advantages.

Spec D.11 steps 1-3. Randomness is keyed by *global* sample position
(seed, epoch, sampling batch, position in the global batch), not by rank: the same
global batch then gives the same rollouts whether it runs on 1 process or on N
(torchrun), which is what lets the multi-process run be checked against one process.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import pandas as pd
import torch
from tqdm.auto import tqdm

from marble.config import RunConfig
from marble.data.records import reward_masks
from marble.maths.advantages import advantage_correlation, advantage_slope, group_advantages, nan_weighted_mean
from marble.maths.advantage_balancers import gdpo_advantages, reward_sum_advantages
from marble.models.encode import decode_latents, encode_prompts, latent_shape
from marble.models.lora import use_adapter
from marble.models.sampling import sample_latents
from marble.runtime import distributed as dist
from marble.runtime.seeds import keyed_generator
from marble.training.metrics import advantage_std, reward_stats

# Streams of the keyed generators: one per use, so changing one never shifts another.
# STREAM_TIMESTEPS draws a sample's timestep subset, then its fresh training noise.
STREAM_ROLLOUT_NOISE, STREAM_SHUFFLE, STREAM_TIMESTEPS = 1, 2, 3


@dataclass
class Rollouts:
    """This rank's samples of one epoch (all tensors row-aligned)."""

    x0: torch.Tensor  # [N, C, h, w] clean latents, float32, on the training device
    prompt_embeds: torch.Tensor  # [N, L, D]
    pooled: torch.Tensor  # [N, P]
    global_index: torch.Tensor  # [N] long: position in the epoch's global sample order
    rewards: torch.Tensor  # [N, K] raw scores, NaN = not applicable / unscorable
    advantages: torch.Tensor  # [N, K] per-reward group advantages, NaN masked
    avg_advantage: torch.Tensor  # [N] advantage of the NaN-aware weighted mean reward
    metrics: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return self.x0.shape[0]


def set_thread_device(device: str) -> None:
    """Pool-thread initializer: a new thread's current CUDA device is 0 whatever the rank's,
    so a scorer on `cuda:N` would put its inputs on cuda:0 without this."""
    if torch.device(device).type == "cuda":
        torch.cuda.set_device(torch.device(device))


class RewardScorer:
    """Scores decoded batches on a thread pool (rewards overlap each other and the sampler)."""

    def __init__(self, rewards: dict, masks: dict[str, torch.Tensor], device: str = "cpu"):
        self.rewards = rewards  # name -> callable reward
        self.masks = masks  # name -> [rows] bool applicability from the table (may be absent)
        self.pool = ThreadPoolExecutor(max_workers=max(1, len(rewards)),
                                       thread_name_prefix="reward",
                                       initializer=set_thread_device, initargs=(device,))
        self.seconds = {name: 0.0 for name in rewards}

    def _score_one(self, name: str, images, prompts, metadata, rows) -> torch.Tensor:
        start = time.perf_counter()
        with torch.no_grad():  # grad mode is thread-local: set it in the worker
            scores = self.rewards[name](images, prompts, metadata).detach().float().cpu()
        if scores.shape != (len(prompts),):
            raise ValueError(f"reward {name!r} returned shape {tuple(scores.shape)} "
                             f"for {len(prompts)} images")
        # A scorer that is no marble Reward (a registered callable) can hand back +-inf: as
        # Reward.__call__ does, every non-finite score is unscorable (NaN, counted as reward_nan).
        scores = torch.where(torch.isfinite(scores), scores, torch.full_like(scores, float("nan")))
        if name in self.masks:
            applies = self.masks[name][rows]
            scores = torch.where(applies, scores, torch.full_like(scores, float("nan")))
        self.seconds[name] += time.perf_counter() - start
        return scores

    def submit(self, images, prompts, metadata, rows) -> list[Future]:
        rows = torch.as_tensor(rows, dtype=torch.long)
        return [self.pool.submit(self._score_one, name, images, prompts, metadata, rows)
                for name in self.rewards]

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def table_masks(table: pd.DataFrame, names: list[str]) -> dict[str, torch.Tensor]:
    """[rows] bool applicability per reward the table has a mask for (the data layer's reader)."""
    return {n: torch.tensor(m, dtype=torch.bool) for n, m in reward_masks(table, names).items()}


def applicable_mask(table: pd.DataFrame, names: list[str], rows: torch.Tensor,
                    rewards: torch.Tensor) -> torch.Tensor:
    """[N, K] applicability: the table's mask when present, else 'scored or NaN-by-rule'."""
    masks = table_masks(table, names)
    cols = [masks[name][rows] if name in masks else ~torch.isnan(rewards[:, k])
            for k, name in enumerate(names)]
    return torch.stack(cols, dim=1)


def compute_advantages(rewards_all: torch.Tensor, groups_all: torch.Tensor,
                       weights: list[float], method: str = "weighted_sum"
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-reward group advantages [M, K] and the one-per-sample advantage [M] of the
    weighted-sum step: the weighted-mean reward's, or GDPO's / the per-reward sum's for
    those balancers (marble.maths.advantage_balancers)."""
    group_ids = groups_all.tolist()
    adv = group_advantages(rewards_all.double(), group_ids)
    if method == "gdpo":
        avg_adv = gdpo_advantages(rewards_all.double(), group_ids, weights)
    elif method == "reward_sum":
        avg_adv = reward_sum_advantages(rewards_all.double(), group_ids, weights)
    else:
        avg = nan_weighted_mean(rewards_all.double(), torch.tensor(weights, dtype=torch.float64))
        avg_adv = group_advantages(avg, group_ids)
    return adv.float(), avg_adv.float()


def epoch_reward_metrics(names, rewards_all, applicable_all, adv_all, avg_all) -> dict:
    """Per reward: its reward statistics, its advantage's std and `dilution/<name>`, the
    correlation of the one-per-sample advantage (`avg_all`: the weighted sum's) with the
    reward's own advantage on the samples it applies to (issue 36 item 3: how much of a
    specialist's signal the weighted sum keeps; MARBLE's per-reward terms keep all of it)."""
    out: dict = {}
    for k, name in enumerate(names):
        out.update(reward_stats(name, rewards_all[:, k], applicable_all[:, k]))
        out[f"adv_std/{name}"] = advantage_std(adv_all[:, k])
        out[f"dilution/{name}"] = advantage_correlation(avg_all, adv_all[:, k])
        # issue 47: the slope tells attenuation (0 < slope < 1) from opposition (slope < 0)
        out[f"attenuation/{name}"] = advantage_slope(avg_all, adv_all[:, k])
    return out


class RolloutEngine:
    """Draws, samples, decodes and scores one epoch's rollouts on this rank."""

    def __init__(self, pipe, cfg: RunConfig, table: pd.DataFrame, rewards: dict, sampler,
                 sigmas: torch.Tensor, info, autocast, embed_cache=None, progress: bool = True,
                 reward_device: str = "cpu"):
        self.pipe, self.cfg, self.table = pipe, cfg, table
        self.names = cfg.reward_names
        self.sampler, self.sigmas, self.info = sampler, sigmas, info
        self.autocast, self.embed_cache, self.progress = autocast, embed_cache, progress
        self.groups = torch.as_tensor(pd.factorize(table["prompt_id"])[0], dtype=torch.long)
        self.metadata = [json.loads(m) if isinstance(m, str) else dict(m or {})
                         for m in table["metadata"]]
        self.scorer = RewardScorer(rewards, table_masks(table, self.names), reward_device)

    def embed(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompt embeddings: the cache when configured, else the text encoders."""
        device = self.info.device
        if self.embed_cache is not None:
            embeds, pooled = self.embed_cache.lookup(prompts)
        else:
            with torch.no_grad():
                embeds, pooled = encode_prompts(self.pipe, prompts,
                                                self.cfg.model.max_sequence_length)
        dtype = self.pipe.transformer.dtype
        return embeds.to(device, dtype), pooled.to(device, dtype)

    def rollout_noise(self, epoch: int, batch_i: int, shape: tuple) -> tuple:
        """Initial latents keyed by global position: identical for any world size."""
        s, w = self.cfg.sampling, self.info.world_size
        start = batch_i * w * s.batch_size + self.info.rank * s.batch_size
        seed = self.cfg.train.seed
        noise = [torch.randn(shape, generator=keyed_generator(seed, STREAM_ROLLOUT_NOISE, epoch,
                                                              start + j))
                 for j in range(s.batch_size)]
        return torch.stack(noise), torch.arange(start, start + s.batch_size)

    @torch.no_grad()
    def sample_batch(self, epoch: int, batch_i: int):
        s = self.cfg.sampling
        self.sampler.set_epoch(epoch * s.num_batches_per_epoch + batch_i)
        rows = torch.as_tensor(self.sampler.batch(), dtype=torch.long)
        prompts = [self.table["prompt"].iat[int(r)] for r in rows]
        metadata = [self.metadata[int(r)] for r in rows]
        embeds, pooled = self.embed(prompts)
        shape = tuple(latent_shape(self.pipe, s.resolution))
        noise, gidx = self.rollout_noise(epoch, batch_i, shape)
        transformer = self.pipe.transformer
        with use_adapter(transformer, "old"), self.autocast():
            x0 = sample_latents(transformer, noise.to(self.info.device, torch.float32), embeds,
                                pooled, self.sigmas, s.solver, guidance_scale=s.guidance_scale)
        x0 = x0.float()
        # Decoded under the run's autocast, as the reference's pipeline call is (fp16 VAE
        # convolutions on a GPU: half the activation memory of an fp32 decode).
        with self.autocast():
            images = decode_latents(self.pipe, x0).float().cpu()
        futures = self.scorer.submit(images, prompts, metadata, rows)
        return rows, x0, embeds, pooled, gidx, futures

    def collect(self, epoch: int) -> Rollouts:
        s = self.cfg.sampling
        start = time.perf_counter()
        self.scorer.seconds = {n: 0.0 for n in self.names}
        parts = []
        bar = tqdm(range(s.num_batches_per_epoch), desc=f"rollouts e{epoch}", leave=False,
                   disable=not (self.progress and self.info.rank == 0))
        for i in bar:
            parts.append(self.sample_batch(epoch, i))
        rows = torch.cat([p[0] for p in parts])
        rewards = torch.stack([torch.cat([p[5][k].result() for p in parts])
                               for k in range(len(self.names))], dim=1)
        rollout_s = time.perf_counter() - start
        applicable = applicable_mask(self.table, self.names, rows, rewards)
        # Advantages use the whole global batch: gather rewards and groups, rank-major.
        rewards_all = dist.all_gather_cat(rewards)
        groups_all = dist.all_gather_cat(self.groups[rows])
        applicable_all = dist.all_gather_cat(applicable)
        weights = [r.weight for r in self.cfg.rewards]
        adv_all, avg_all = compute_advantages(rewards_all, groups_all, weights,
                                              self.cfg.balancer.method)
        n, rank = len(rows), self.info.rank
        mine = slice(rank * n, (rank + 1) * n)
        metrics = epoch_reward_metrics(self.names, rewards_all, applicable_all, adv_all, avg_all)
        metrics["time/rollout_s"] = rollout_s
        for name, secs in self.scorer.seconds.items():
            metrics[f"time/reward_{name}_s"] = secs
        dev = self.info.device
        return Rollouts(
            x0=torch.cat([p[1] for p in parts]), prompt_embeds=torch.cat([p[2] for p in parts]),
            pooled=torch.cat([p[3] for p in parts]), global_index=torch.cat([p[4] for p in parts]),
            rewards=rewards, advantages=adv_all[mine].to(dev), avg_advantage=avg_all[mine].to(dev),
            metrics=metrics,
        )

    def close(self) -> None:
        self.scorer.close()
