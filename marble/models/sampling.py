"""Rollout samplers (docs/algorithm.md §2): deterministic DPM-Solver++(2M) and the Euler flow ODE.

Flow parameterisation: z_sigma = alpha * x0 + sigma * eps with alpha = 1 - sigma, and
the transformer predicts v ~ eps - x0, so x0_hat = z - sigma * v. DPM-Solver++ works
in x0-prediction with lambda = log(alpha / sigma). The solver updates are small pure
functions of scalars and tensors, tested on an analytic field in tests/test_sampling.py.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import Tensor
from tqdm.auto import tqdm

from marble.models.encode import velocity

SOLVERS = ("dpm2", "euler")


def sigma_schedule(scheduler, num_steps: int) -> Tensor:
    """The scheduler's (shifted) sigmas for `num_steps` steps plus a final 0: [num_steps + 1].

    A copy of the scheduler is used: set_timesteps mutates its state.
    """
    scheduler = copy.deepcopy(scheduler)
    scheduler.set_timesteps(num_steps, device="cpu")
    sigmas = scheduler.sigmas.detach().to(torch.float64).cpu()
    if sigmas.numel() == num_steps:  # schedulers that do not append the terminal sigma
        sigmas = torch.cat([sigmas, sigmas.new_zeros(1)])
    if sigmas.numel() != num_steps + 1 or sigmas[-1] != 0:
        raise ValueError(f"unexpected sigma schedule from {type(scheduler).__name__}: {sigmas.tolist()}")
    return sigmas.float()


def euler_step(z: Tensor, v: Tensor, sigma: float, sigma_next: float) -> Tensor:
    """One Euler step of the flow ODE dz/dsigma = v."""
    return z + (sigma_next - sigma) * v


def _half_log_snr(sigma: float) -> float:
    """lambda = log(alpha / sigma), alpha = 1 - sigma; -inf at sigma=1, +inf at sigma=0."""
    alpha = 1.0 - sigma
    if alpha <= 0.0:
        return -math.inf
    if sigma <= 0.0:
        return math.inf
    return math.log(alpha) - math.log(sigma)


def dpm2_coefficients(sigma_prev: float | None, sigma: float, sigma_next: float,
                      first_order: bool) -> tuple[float, float, float]:
    """(a, b, c) with z_next = a * z + b * x0_hat + c * x0_hat_prev (DPM-Solver++(2M)).

    First order (DDIM, eta=0): z_next = (s'/s) z + alpha'(1 - e^{-h}) x0_hat.
    Second order: x0_hat is replaced by D = (1 + 1/(2r)) x0_hat - 1/(2r) x0_hat_prev with
    r = h_prev / h, h = lambda' - lambda. Computed in float64 Python scalars.
    """
    alpha_next = 1.0 - sigma_next
    a = sigma_next / sigma
    # e^{-h} = (sigma' * alpha) / (alpha' * sigma), written without lambdas so the
    # endpoints sigma=1 (alpha=0) and sigma'=0 stay finite: both give e^{-h} = 0.
    exp_neg_h = 0.0 if sigma_next == 0.0 else sigma_next * (1.0 - sigma) / (alpha_next * sigma)
    b = alpha_next * (1.0 - exp_neg_h)
    if first_order or sigma_prev is None or sigma_next == 0.0:
        return a, b, 0.0
    h = _half_log_snr(sigma_next) - _half_log_snr(sigma)
    h_prev = _half_log_snr(sigma) - _half_log_snr(sigma_prev)
    # h_prev = inf when the previous point was sigma=1: the correction vanishes (1/r = 0).
    inv_2r = 0.0 if math.isinf(h_prev) else 0.5 * h / h_prev
    return a, b * (1.0 + inv_2r), -b * inv_2r


def dpm2_step(z: Tensor, x0_hat: Tensor, x0_hat_prev: Tensor | None, sigma_prev: float | None,
              sigma: float, sigma_next: float, first_order: bool = False) -> Tensor:
    """One DPM-Solver++(2M) step from sigma to sigma_next in x0-prediction."""
    a, b, c = dpm2_coefficients(sigma_prev, sigma, sigma_next,
                                first_order or x0_hat_prev is None)
    out = a * z + b * x0_hat
    return out + c * x0_hat_prev if c != 0.0 else out


def _guided_velocity(transformer, z: Tensor, sigma: float, prompt_embeds: Tensor, pooled: Tensor,
                     guidance_scale: float, negative: tuple[Tensor, Tensor] | None) -> Tensor:
    if guidance_scale <= 1.0:
        return velocity(transformer, z, sigma, prompt_embeds, pooled, integer_timestep=True)
    if negative is None:
        raise ValueError("guidance_scale > 1 needs `negative` = (negative_embeds, negative_pooled)")
    batch = z.shape[0]
    neg_embeds = negative[0].expand(batch, *negative[0].shape[1:])
    neg_pooled = negative[1].expand(batch, *negative[1].shape[1:])
    v = velocity(transformer, torch.cat([z, z]), sigma, torch.cat([neg_embeds, prompt_embeds]),
                 torch.cat([neg_pooled, pooled]), integer_timestep=True)
    v_neg, v_pos = v.chunk(2)
    return v_neg + guidance_scale * (v_pos - v_neg)


@torch.no_grad()
def sample_latents(transformer, noise: Tensor, prompt_embeds: Tensor, pooled: Tensor,
                   sigmas: Tensor, solver: str = "dpm2", guidance_scale: float = 1.0,
                   negative: tuple[Tensor, Tensor] | None = None, progress: bool = False) -> Tensor:
    """Integrate from `noise` (at sigmas[0]) to x0 [B, C, h, w] with the active adapter.

    Deterministic given `noise`: rollout diversity comes only from the initial latent
    (docs/algorithm.md §2). The transformer timestep is int(sigma * 1000), as in the reference.
    """
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; choose one of {SOLVERS}")
    sig = [float(s) for s in sigmas]
    num_steps = len(sig) - 1
    z = noise.float()
    x0_prev, sigma_prev = None, None
    steps = tqdm(range(num_steps), desc=f"sampling ({solver})", disable=not progress, leave=False)
    for i in steps:
        sigma, sigma_next = sig[i], sig[i + 1]
        v = _guided_velocity(transformer, z, sigma, prompt_embeds, pooled, guidance_scale,
                             negative).float()
        if solver == "euler":
            z = euler_step(z, v, sigma, sigma_next)
            continue
        x0_hat = z - sigma * v
        # First and last steps are first order (docs/algorithm.md §2); the last lands on x0_hat.
        first_order = i == 0 or i == num_steps - 1
        z = dpm2_step(z, x0_hat, x0_prev, sigma_prev, sigma, sigma_next, first_order)
        x0_prev, sigma_prev = x0_hat, sigma
    return z
