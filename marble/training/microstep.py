"""One DiffusionNFT micro-step: a rollout micro-batch at one timestep -> `MicroStep`.

The trainer and `marble bench` both call `build_micro_step`; the balancer then turns
the `MicroStep` into gradients. docs/algorithm.md §4 / reference `train.py`:

    x_t     = (1 - sigma) x0 + sigma eps
    v_old   = v(x_t) with the "old" adapter        (no grad)
    v_ref   = v(x_t) with the adapters disabled    (no grad, the frozen base model)
    v_theta = v(x_t) with the trainable "default" adapter
    loss_i(r) = (C / beta) (r_i l+_i + (1 - r_i) l-_i)     (nft_terms, from v_theta, v_old)
    KL      = lambda_KL mean_i mean (v_theta - v_ref)^2

The timestep fed to the transformer is the float sigma * 1000 in fp32 (not cast to
the weights' dtype; the reference passes its fp32 scheduler timesteps under autocast).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from marble.balancers import MicroStep
from marble.balancers.per_sample import PerSampleGrads
from marble.maths.nft import kl_loss, nft_loss_from_terms, nft_terms, optimality_prob
from marble.models.encode import velocity
from marble.models.lora import adapters_disabled, use_adapter

__all__ = ["MicroBatch", "reference_velocities", "theta_velocity",
           "build_micro_step", "logged_losses", "run_micro_step"]


@dataclass
class MicroBatch:
    """One micro-batch at one training timestep per sample (all on the training device)."""

    x0: torch.Tensor  # [B, C, h, w] clean latents
    x_t: torch.Tensor  # [B, C, h, w] noised latents
    sigma: torch.Tensor  # [B] noise level in [0, 1]
    prompt_embeds: torch.Tensor  # [B, L, D]
    pooled: torch.Tensor  # [B, P]
    advantages: torch.Tensor  # [B, K], NaN = reward not applicable
    avg_advantage: torch.Tensor  # [B]
    # Per reward, whether any sample here has it, known on the host (see MicroStep).
    reward_present: tuple | None = None


def reference_velocities(transformer, batch: MicroBatch, autocast) -> tuple:
    """(v_old, v_ref) in fp32, without a graph: the "old" adapter and the frozen base."""
    args = (batch.x_t, batch.sigma, batch.prompt_embeds, batch.pooled)
    with torch.no_grad(), autocast():
        with use_adapter(transformer, "old"):
            v_old = velocity(transformer, *args).float()
        with adapters_disabled(transformer):
            v_ref = velocity(transformer, *args).float()
    return v_old, v_ref


def theta_velocity(transformer, batch: MicroBatch, autocast) -> torch.Tensor:
    """v_theta in fp32 with the trainable "default" adapter; carries the graph."""
    args = (batch.x_t, batch.sigma, batch.prompt_embeds, batch.pooled)
    with use_adapter(transformer, "default"), autocast():
        return velocity(transformer, *args).float()


def build_micro_step(transformer, batch: MicroBatch, train_cfg, params: list, autocast, *,
                     scale: float, global_step: int, micro_index: int, grad_scaler=None,
                     per_sample: bool = False):
    """The `MicroStep` of one micro-batch: forwards, NFT terms and the KL term.

    `train_cfg` is a `TrainConfig` (nft_beta, kl_beta, adv_clip); `autocast` a zero-arg
    context factory (a `marble.runtime.precision.Precision`); `grad_scaler` the fp16 scaler;
    `per_sample`: the v_theta forward records the LoRA layers' inputs (`balancer.fresh: exact`).
    """
    t = train_cfg
    beta, clip = t.nft_beta, t.adv_clip
    v_old, v_ref = reference_velocities(transformer, batch, autocast)
    recorder = PerSampleGrads(transformer, params) if per_sample else None

    # Why a closure: `balancer.full_solve: recompute` reruns only the v_theta forward on
    # the same micro-batch (v_old and v_ref carry no graph and are reused).
    # The loss head as a function of a prediction: `balancer.gram_space: output` differentiates
    # it at a detached copy of v_theta (dL_k/dv without a backward through the transformer).
    def head(v: torch.Tensor) -> tuple:
        l_pos, l_neg = nft_terms(v, v_old, batch.x0, batch.x_t, batch.sigma, beta)

        def loss_per_sample(r: torch.Tensor) -> torch.Tensor:
            return nft_loss_from_terms(l_pos, l_neg, r, beta, clip)

        return loss_per_sample, t.kl_beta * kl_loss(v, v_ref).mean()

    def forward() -> MicroStep:
        with recorder.recording(batch.x0.shape[0]) if recorder else contextlib.nullcontext():
            v_theta = theta_velocity(transformer, batch, autocast)
        loss_per_sample, kl_term = head(v_theta)
        return MicroStep(
            loss_per_sample=loss_per_sample, kl=kl_term, advantages=batch.advantages,
            avg_advantage=batch.avg_advantage, scale=scale, params=params,
            global_step=global_step, micro_index=micro_index, adv_clip=clip,
            grad_scaler=grad_scaler, recompute=forward, reward_present=batch.reward_present,
            prediction=v_theta, loss_head=head, per_sample=recorder)

    return forward()


@torch.no_grad()
def logged_losses(step) -> dict[str, torch.Tensor]:
    """The weighted-sum objective and KL of a micro-step, logged for every balancer so
    runs compare (the reference's `policy_loss` with NaN advantages read as 0). Device
    scalars: read once per optimizer step (`StepAverager.result`)."""
    r_avg = optimality_prob(torch.nan_to_num(step.avg_advantage, nan=0.0), step.adv_clip)
    return {"loss/policy": step.loss_per_sample(r_avg).mean(),
            "loss/kl": torch.as_tensor(step.kl).detach()}


def run_micro_step(transformer, batch: MicroBatch, train_cfg, params: list, autocast,
                   balancer, *, scale: float, global_step: int, micro_index: int,
                   grad_scaler=None) -> dict:
    """What the trainer runs per micro-step: `build_micro_step`, the balancer's backward
    (gradients into p.grad) and the logged weighted-sum losses. The metrics stay device
    scalars: no host read here (StepAverager reads them once per optimizer step)."""
    step = build_micro_step(transformer, batch, train_cfg, params, autocast, scale=scale,
                            global_step=global_step, micro_index=micro_index,
                            grad_scaler=grad_scaler,
                            per_sample=getattr(balancer, "needs_per_sample", False))
    metrics = dict(balancer.backward(step))
    # The weighted-sum objective is logged for every balancer, so runs compare.
    for key, value in logged_losses(step).items():
        metrics.setdefault(key, value)
    return metrics
