"""The DiffusionNFT optimisation loop with a reward balancer (spec D.11 steps 4-8).

One optimizer step per epoch: G micro-batches x T_train timesteps, each a
`MicroStep` handed to the balancer, then all-reduce of .grad, clip, AdamW, weight EMA,
and at the end of the epoch the old-policy blend. Resume restores every piece of
state, so N steps straight equal k steps + resume + N-k steps bitwise on the CPU.
"""

from __future__ import annotations

import contextlib
import random
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from marble import distributed as dist
from marble.checkpoint import (capture_rng_state, checkpoint_dir, latest_checkpoint,
                               load_checkpoint, restore_rng_state, save_checkpoint)
from marble.config import RunConfig, dump_yaml, grad_accumulation, training_timesteps
from marble.ema import WeightEMA, old_policy_decay
from marble.io import write_json, write_text
from marble.metrics import MetricsLog, StepAverager
from marble.nft import nft_loss_from_terms, nft_terms, kl_loss, optimality_prob
from marble.rollout import (STREAM_SHUFFLE, STREAM_TIMESTEPS, RolloutEngine, Rollouts,
                            keyed_generator)

_DTYPES = {"no": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def autocast_factory(mixed_precision: str, device: torch.device):
    """A zero-arg context factory: autocast on CUDA for fp16/bf16, nothing otherwise."""
    if device.type != "cuda" or mixed_precision == "no":
        return contextlib.nullcontext
    dtype = _DTYPES[mixed_precision]
    return lambda: torch.autocast("cuda", dtype=dtype)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


@torch.no_grad()
def upcast_lora_(transformer) -> None:
    """Adapter weights in fp32 over fp16/bf16 base weights: AdamW and GradScaler.unscale_
    need fp32 master weights (a no-op on the CPU, where everything is fp32)."""
    for name, param in transformer.named_parameters():
        if "lora_" in name and param.dtype != torch.float32:
            param.data = param.data.float()


def build_rewards(cfg: RunConfig) -> dict:
    from marble import rewards as registry

    return {spec.name: registry.build(spec.name, applies_to=spec.applies_to, **spec.options)
            for spec in cfg.rewards}


class Trainer:
    """Owns the model, adapters, optimizer, EMA, balancer and sampler of one run."""

    def __init__(self, cfg: RunConfig, out_dir: str | Path, device: str | None = None,
                 progress: bool = True):
        from marble.balancers import build_balancer
        from marble.data import load_table
        from marble.data.sampler import StratifiedKRepeatSampler
        from marble.models import load_pipeline
        from marble.models.lora import add_lora_adapters, trainable_lora_parameters
        from marble.sampling import sigma_schedule

        self.cfg, self.out_dir, self.progress = cfg, Path(out_dir), progress
        self.info = dist.init_distributed(device)
        dev = self.info.device
        t, m, s = cfg.train, cfg.model, cfg.sampling
        # Base weights in the compute dtype on CUDA; LoRA stays fp32 (peft upcasts adapters).
        weight_dtype = _DTYPES[m.mixed_precision] if dev.type == "cuda" else torch.float32
        self.pipe = load_pipeline(m.path, revision=m.revision, dtype=weight_dtype, device=dev)
        seed_everything(t.seed)  # same LoRA init on every rank
        add_lora_adapters(self.pipe.transformer, rank=m.lora_rank, alpha=m.lora_alpha,
                          targets=m.lora_targets, seed=t.seed)
        upcast_lora_(self.pipe.transformer)
        self.params = trainable_lora_parameters(self.pipe.transformer)
        self.optimizer = torch.optim.AdamW(self.params, lr=t.lr, betas=tuple(t.adam_betas),
                                           weight_decay=t.weight_decay, eps=t.adam_eps)
        self.ema = WeightEMA(self.params, max_decay=t.ema_decay)
        self.balancer = build_balancer(cfg.balancer, cfg.reward_names)
        use_scaler = dev.type == "cuda" and m.mixed_precision == "fp16"
        self.scaler = torch.amp.GradScaler("cuda") if use_scaler else None
        self.autocast = autocast_factory(m.mixed_precision, dev)
        self.table = load_table(cfg.data.train)
        self.sampler = StratifiedKRepeatSampler(
            self.table["source"].tolist(), k=s.images_per_prompt, batch_size=s.batch_size,
            world_size=self.info.world_size, rank=self.info.rank, seed=t.seed,
            stratified=cfg.data.stratified)
        self.sigmas = sigma_schedule(self.pipe.scheduler, s.num_steps).to(dev, torch.float32)
        self.rollouts = RolloutEngine(self.pipe, cfg, self.table, build_rewards(cfg),
                                      self.sampler, self.sigmas, self.info, self.autocast,
                                      self._embed_cache(), progress)
        self.metrics = MetricsLog(self.out_dir / "metrics.jsonl", enabled=self.info.is_main,
                                  backends=cfg.logging.backends)
        self.step, self.epoch = 0, 0

    def _embed_cache(self):
        if not self.cfg.data.embed_cache:
            return None
        from marble.data.embed_cache import EmbeddingCache

        return EmbeddingCache(self.cfg.data.embed_cache)

    # ------------------------------------------------------------ state

    def _adapter_states(self) -> dict:
        from marble.models.lora import adapter_state

        tr = self.pipe.transformer
        return {"default": adapter_state(tr, "default"), "old": adapter_state(tr, "old")}

    def save(self) -> Path:
        """Checkpoint on the main rank (all ranks hold identical state); others wait."""
        from marble.models.lora import adapter_state, save_lora_diffusers

        path = checkpoint_dir(self.out_dir, self.step)
        if self.info.is_main:
            with self.ema.swapped():
                ema_state = adapter_state(self.pipe.transformer, "default")
            state = {
                "step": self.step, "epoch": self.epoch, "rng": capture_rng_state(),
                "sampler": self.sampler.state_dict(), "balancer": self.balancer.state_dict(),
                "ema": self.ema.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            }
            save_checkpoint(
                path, state, adapters=self._adapter_states(),
                optimizer_state=self.optimizer.state_dict(),
                write_lora=lambda d: save_lora_diffusers(self.pipe.transformer, d, "default",
                                                         ema_state),
                keep=self.cfg.train.keep_checkpoints)
        dist.barrier()
        return path

    def resume(self) -> Path | None:
        """Load the newest complete checkpoint of the run folder, if any."""
        from marble.models.lora import load_adapter_state

        path = latest_checkpoint(self.out_dir)
        if path is None:
            return None
        # CPU first: RNG states must stay CPU tensors; the optimizer and adapters move
        # their tensors to the parameters' device on load.
        ckpt = load_checkpoint(path, map_location="cpu")
        for name, tensors in ckpt["adapters"].items():
            load_adapter_state(self.pipe.transformer, name, tensors)
        self.optimizer.load_state_dict(ckpt["optimizer"])
        state = ckpt["state"]
        self.ema.load_state_dict(state["ema"])
        self.ema.shadow = [s.to(p.device) for s, p in zip(self.ema.shadow, self.params)]
        self.balancer.load_state_dict(state["balancer"])
        self.sampler.load_state_dict(state["sampler"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        restore_rng_state(state["rng"])
        self.step, self.epoch = int(state["step"]), int(state["epoch"])
        self.metrics.truncate_after(self.step)
        return path

    # ------------------------------------------------------------ one epoch

    def train_epoch(self) -> dict:
        t0 = time.perf_counter()
        ro = self.rollouts.collect(self.epoch)
        # Means over micro-steps: `full_solve` is the fraction of micro-steps that solved;
        # alpha/* keep the last value (the weights in force after the step).
        averager = StepAverager()
        self._optimize(ro, averager)
        record = {"step": self.step, "epoch": self.epoch, "balancer": self.cfg.balancer.method}
        record.update(ro.metrics)
        step_metrics = averager.result()
        loss_keys = sorted(k for k in step_metrics if k.startswith("loss/"))
        if loss_keys and self.info.world_size > 1:  # per-rank losses -> global means
            values = torch.tensor([step_metrics[k] for k in loss_keys], dtype=torch.float64,
                                  device=self.info.device)
            means = dist.all_reduce_mean_(values)
            step_metrics.update(zip(loss_keys, means.tolist()))
        record.update(step_metrics)
        record["time/step_s"] = time.perf_counter() - t0
        decay = old_policy_decay(self.step, self.cfg.train.old_decay_type,
                                 self.cfg.train.old_decay_cap)
        from marble.models.lora import blend_adapter

        blend_adapter(self.pipe.transformer, dst="old", src="default", decay=decay)
        record["old_decay"] = decay
        self.epoch += 1
        if self.step % max(1, self.cfg.train.log_every) == 0:
            self.metrics.log(record)
        return record

    def _per_sample_draws(self, global_index: torch.Tensor, n_t: int, shape) -> tuple:
        """Per sample: a T_train subset of the sigma grid (spec A.7) and fresh noise.

        Keyed by the sample's global position, so a sample gets the same draws on any
        number of ranks and whichever micro-batch it lands in.
        """
        seed, num_steps = self.cfg.train.seed, self.cfg.sampling.num_steps
        tsel, noise = [], []
        for gidx in global_index.tolist():
            gen = keyed_generator(seed, STREAM_TIMESTEPS, self.epoch, gidx)
            tsel.append(torch.randperm(num_steps, generator=gen)[:n_t])
            noise.append(torch.randn((n_t, *shape), generator=gen))
        dev = self.info.device
        return torch.stack(tsel).to(dev), torch.stack(noise).to(dev)

    def _micro_step(self, ro: Rollouts, idx, t_index, eps, scale: float, micro: int) -> dict:
        from marble.balancers import MicroStep
        from marble.models.encode import velocity
        from marble.models.lora import adapters_disabled, use_adapter

        t = self.cfg.train
        tr = self.pipe.transformer
        x0, emb, pooled = ro.x0[idx], ro.prompt_embeds[idx], ro.pooled[idx]
        sig = self.sigmas[t_index]
        sb = sig.view(-1, *([1] * (x0.dim() - 1)))
        x_t = (1.0 - sb) * x0 + sb * eps
        with torch.no_grad(), self.autocast():
            with use_adapter(tr, "old"):
                v_old = velocity(tr, x_t, sig, emb, pooled).float()
            with adapters_disabled(tr):
                v_ref = velocity(tr, x_t, sig, emb, pooled).float()
        with use_adapter(tr, "default"), self.autocast():
            v_theta = velocity(tr, x_t, sig, emb, pooled).float()
        l_pos, l_neg = nft_terms(v_theta, v_old, x0, x_t, sig, t.nft_beta)
        # fp16: scale both terms by the GradScaler's factor; every balancer is
        # positively homogeneous in the gradients, so unscale_ later undoes it exactly.
        loss_scale = float(self.scaler.get_scale()) if self.scaler is not None else 1.0
        kl_term = t.kl_beta * kl_loss(v_theta, v_ref).mean()

        def loss_per_sample(r: torch.Tensor) -> torch.Tensor:
            return nft_loss_from_terms(l_pos, l_neg, r, t.nft_beta, t.adv_clip) * loss_scale

        step = MicroStep(
            loss_per_sample=loss_per_sample, kl=kl_term * loss_scale,
            advantages=ro.advantages[idx], avg_advantage=ro.avg_advantage[idx], scale=scale,
            params=self.params, global_step=self.step, micro_index=micro, adv_clip=t.adv_clip)
        metrics = dict(self.balancer.backward(step))
        with torch.no_grad():
            r_avg = optimality_prob(torch.nan_to_num(ro.avg_advantage[idx], nan=0.0), t.adv_clip)
            ws_loss = nft_loss_from_terms(l_pos, l_neg, r_avg, t.nft_beta, t.adv_clip).mean()
        # The weighted-sum objective is logged for every balancer, so runs compare.
        metrics.setdefault("loss/policy", float(ws_loss))
        metrics.setdefault("loss/kl", float(kl_term.detach()))
        return metrics

    def _optimize(self, ro: Rollouts, averager: StepAverager) -> None:
        t = self.cfg.train
        n, bsz = len(ro), t.batch_size
        n_micro, n_t = n // bsz, training_timesteps(self.cfg)
        if n_micro != grad_accumulation(self.cfg):
            raise RuntimeError(f"{n} rollouts on this rank do not make "
                               f"{grad_accumulation(self.cfg)} micro-batches of {bsz}")
        scale = 1.0 / (n_micro * n_t)
        perm = torch.randperm(n, generator=keyed_generator(t.seed, STREAM_SHUFFLE, self.epoch,
                                                           self.info.rank))
        bar = tqdm(total=n_micro * n_t, desc=f"step {self.step}", leave=False,
                   disable=not (self.progress and self.info.is_main))
        for g in range(n_micro):
            idx = perm[g * bsz:(g + 1) * bsz].to(self.info.device)
            t_sel, noise = self._per_sample_draws(ro.global_index[idx.cpu()], n_t,
                                                  tuple(ro.x0.shape[1:]))
            for j in range(n_t):
                averager.add(self._micro_step(ro, idx, t_sel[:, j], noise[:, j], scale,
                                              g * n_t + j))
                bar.update(1)
        bar.close()
        averager.add(self._apply_update())

    def _all_reduce_grads(self) -> None:
        """Mean of .grad over ranks in one flat collective (no DDP wrapper, see ARCHITECTURE)."""
        if self.info.world_size == 1:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = dist.all_reduce_mean_(torch.cat([g.reshape(-1).float() for g in grads]))
        offset = 0
        for p in self.params:
            numel = p.numel()
            p.grad = flat[offset:offset + numel].view_as(p).to(p.dtype).clone()
            offset += numel

    def _apply_update(self) -> dict:
        t = self.cfg.train
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        self._all_reduce_grads()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, t.max_grad_norm)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        decay = self.ema.update(self.step)
        self.step += 1
        return {"grad_norm": float(grad_norm), "ema_decay": decay}

    def close(self) -> None:
        self.rollouts.close()


def _final_rewards(records: list[dict]) -> dict:
    if not records:
        return {}
    return {k: v for k, v in records[-1].items() if k.startswith("reward/")}


def run_training(cfg: RunConfig, out_dir: str | Path, device: str | None = None,
                 progress: bool = True) -> dict:
    """Train (or resume) to cfg.train.max_steps; write DIR/train_summary.json; return it."""
    out_dir = Path(out_dir)
    info = dist.init_distributed(device)
    if info.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_text(out_dir / "config.yaml", dump_yaml(cfg))
    start = time.perf_counter()
    trainer = Trainer(cfg, out_dir, device=device, progress=progress)
    try:
        resumed = trainer.resume()
        max_steps, every = cfg.train.max_steps, max(1, cfg.train.save_every)
        bar = tqdm(total=max_steps, initial=trainer.step, desc="train", disable=not (
            progress and info.is_main))
        while trainer.step < max_steps:
            trainer.train_epoch()
            bar.update(1)
            if trainer.step % every == 0 or trainer.step == max_steps:
                trainer.save()
        bar.close()
        if resumed is None and trainer.step == 0:
            trainer.save()  # max_steps 0: still leave a loadable checkpoint
    finally:
        trainer.close()
    last = latest_checkpoint(out_dir)
    summary = {
        "final_step": trainer.step, "epoch": trainer.epoch,
        "last_checkpoint": str(last) if last else None,
        "resumed_from": str(resumed) if resumed else None,
        "wall_time_s": time.perf_counter() - start, "world_size": info.world_size,
        "rank": info.rank,
        "balancer": cfg.balancer.method, "final_rewards": _final_rewards(trainer.metrics.read()),
    }
    if info.is_main:
        write_json(out_dir / "train_summary.json", summary)
    dist.barrier()
    dist.cleanup()
    return summary
