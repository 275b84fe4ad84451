"""Samplers: sigma schedule, solver steps against hand values and an analytic flow."""

from __future__ import annotations

import math

import pytest
import torch

from marble.models.sampling import dpm2_coefficients, dpm2_step, euler_step, sample_latents, sigma_schedule

# One intra-op thread: the CI machine is shared, and 2 threads under load run ~8x slower.
torch.set_num_threads(1)

# Spec A.2's N=10 schedule of SD3.5-M's FlowMatch scheduler (shift 3).
SPEC_SIGMAS_N10 = [1.0, .960, .913, .858, .790, .707, .602, .465, .278, .0089, 0.0]


def test_sigma_schedule_matches_spec_and_leaves_scheduler_alone():
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    before = scheduler.sigmas.clone()
    sigmas = sigma_schedule(scheduler, 10)
    assert sigmas.shape == (11,)
    assert torch.allclose(sigmas, torch.tensor(SPEC_SIGMAS_N10), atol=6e-4)
    assert sigmas[-1] == 0 and torch.all(sigmas[1:] < sigmas[:-1])
    assert torch.equal(scheduler.sigmas, before)
    assert sigma_schedule(scheduler, 25).shape == (26,)


def test_euler_step_by_hand():
    z, v = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 4.0])
    # z + (0.25 - 0.75) * v
    assert torch.allclose(euler_step(z, v, 0.75, 0.25), torch.tensor([0.75, -4.0]))


def test_dpm2_coefficients_by_hand():
    # First order from 0.5 to 0.25: a = 0.25/0.5; e^{-h} = (0.25*0.5)/(0.75*0.5) = 1/3,
    # b = alpha' (1 - e^{-h}) = 0.75 * 2/3 = 0.5.
    a, b, c = dpm2_coefficients(None, 0.5, 0.25, first_order=True)
    assert (a, c) == (0.5, 0.0) and b == pytest.approx(0.5)
    # Second order with previous sigma 0.8: lambda(0.8) = log(0.25), lambda(0.5) = 0,
    # lambda(0.25) = log(3); 1/(2r) = h / (2 h_prev) = log 3 / (2 log 4).
    inv_2r = math.log(3) / (2 * math.log(4))
    a, b, c = dpm2_coefficients(0.8, 0.5, 0.25, first_order=False)
    assert a == 0.5
    assert b == pytest.approx(0.5 * (1 + inv_2r)) and c == pytest.approx(-0.5 * inv_2r)
    # Endpoints: from sigma=1 (alpha=0) the update is sigma' * z + (1 - sigma') * x0_hat;
    # landing on sigma'=0 returns x0_hat exactly.
    assert dpm2_coefficients(None, 1.0, 0.9, True) == pytest.approx((0.9, 0.1, 0.0))
    assert dpm2_coefficients(0.3, 0.1, 0.0, False) == (0.0, 1.0, 0.0)
    # After the sigma=1 point h_prev is infinite, so the correction vanishes.
    assert dpm2_coefficients(1.0, 0.9, 0.8, False)[2] == 0.0


MU, STD = 0.7, 0.3  # data ~ N(MU, STD^2) per element: the flow's velocity is affine in z


def gaussian_velocity(z, sigma):
    """E[eps - x0 | z_sigma] for z_sigma = (1-sigma) x0 + sigma eps, x0 ~ N(MU, STD^2)."""
    var = (1 - sigma) ** 2 * STD ** 2 + sigma ** 2
    centred = z - (1 - sigma) * MU
    return sigma / var * centred - (MU + (1 - sigma) * STD ** 2 / var * centred)


def integrate(velocity_fn, eps, sigmas, solver):
    z, x0_prev, sigma_prev, n = eps.clone(), None, None, len(sigmas) - 1
    for i in range(n):
        sigma, sigma_next = sigmas[i], sigmas[i + 1]
        v = velocity_fn(z, sigma)
        if solver == "euler":
            z = euler_step(z, v, sigma, sigma_next)
        else:
            x0_hat = z - sigma * v
            z = dpm2_step(z, x0_hat, x0_prev, sigma_prev, sigma, sigma_next, i in (0, n - 1))
            x0_prev, sigma_prev = x0_hat, sigma
    return z


def test_solvers_converge_on_gaussian_flow_and_dpm2_is_more_accurate():
    eps = torch.linspace(-2.0, 2.0, 9, dtype=torch.float64)
    exact = MU + STD * eps  # the ODE maps the standardised noise to the standardised data
    errors = {"euler": [], "dpm2": []}
    for n in (5, 10, 20):
        sigmas = [1.0 - i / n for i in range(n + 1)]
        for solver in errors:
            final = integrate(gaussian_velocity, eps, sigmas, solver)
            errors[solver].append((final - exact).abs().max().item())
    print("max abs error at 5/10/20 steps:", errors)
    for solver, errs in errors.items():
        assert errs[0] > errs[1] > errs[2], solver
    assert all(d < e for d, e in zip(errors["dpm2"], errors["euler"]))
    assert errors["dpm2"][2] < 0.01


def test_point_mass_flow_is_solved_exactly_by_both():
    # For a single data point the exact x0 prediction is constant: one step suffices.
    target = torch.tensor([0.3, -1.2])
    eps = torch.tensor([1.0, 0.5])
    field = lambda z, sigma: (z - target) / sigma  # noqa: E731
    for solver in ("euler", "dpm2"):
        final = integrate(field, eps, [1.0, 0.6, 0.2, 0.0], solver)
        assert torch.allclose(final, target, atol=1e-6), solver


@pytest.fixture(scope="module")
def tiny_rollout_inputs(tiny_model_dir):
    from marble.models import encode_prompts, latent_shape, load_pipeline

    pipe = load_pipeline(str(tiny_model_dir))
    embeds, pooled = encode_prompts(pipe, ["a red apple", "a blue car"], max_sequence_length=16)
    neg = encode_prompts(pipe, [""], max_sequence_length=16)
    sigmas = sigma_schedule(pipe.scheduler, 6)
    shape = (2, *latent_shape(pipe, 64))
    return pipe, embeds, pooled, neg, sigmas, shape


def test_sample_latents_deterministic_given_noise(tiny_rollout_inputs):
    pipe, embeds, pooled, neg, sigmas, shape = tiny_rollout_inputs
    noise = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    other = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    for solver in ("dpm2", "euler"):
        first = sample_latents(pipe.transformer, noise, embeds, pooled, sigmas, solver=solver)
        again = sample_latents(pipe.transformer, noise.clone(), embeds, pooled, sigmas, solver=solver)
        assert first.shape == shape and torch.isfinite(first).all()
        assert torch.equal(first, again)
        assert not torch.allclose(first, sample_latents(pipe.transformer, other, embeds, pooled, sigmas,
                                                        solver=solver))
    dpm = sample_latents(pipe.transformer, noise, embeds, pooled, sigmas, solver="dpm2")
    euler = sample_latents(pipe.transformer, noise, embeds, pooled, sigmas, solver="euler")
    assert not torch.allclose(dpm, euler)


def test_sample_latents_cfg_and_errors(tiny_rollout_inputs):
    pipe, embeds, pooled, neg, sigmas, shape = tiny_rollout_inputs
    noise = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    plain = sample_latents(pipe.transformer, noise, embeds, pooled, sigmas)
    guided = sample_latents(pipe.transformer, noise, embeds, pooled, sigmas, guidance_scale=4.5,
                            negative=neg)
    assert guided.shape == shape and not torch.allclose(plain, guided)
    with pytest.raises(ValueError, match="negative"):
        sample_latents(pipe.transformer, noise, embeds, pooled, sigmas, guidance_scale=4.5)
    with pytest.raises(ValueError, match="unknown solver 'rk4'"):
        sample_latents(pipe.transformer, noise, embeds, pooled, sigmas, solver="rk4")
