"""The one micro-step function (marble.training.microstep) against a hand-built NFT + KL gradient.

The hand-built side calls the tiny transformer directly (peft adapter switching, no
marble helper) and writes the DiffusionNFT loss from the formulas of spec A.6; the
balancer side is what the trainer and `marble bench` run. The test checks that it can
fail: swapping v_old and v_ref, or ignoring a reward mask, moves the gradient far
outside the tolerance.
"""

from __future__ import annotations

import pytest
import torch

from marble.balancers import build_balancer
from marble.config import SD3_LORA_TARGETS, BalancerConfig, TrainConfig
from marble.maths.flow import forward_process
from marble.models import load_pipeline
from marble.models.lora import adapter_state, add_lora_adapters, load_adapter_state, trainable_lora_parameters
from marble.runtime.precision import make_precision
from marble.training.microstep import MicroBatch, build_micro_step

B, K = 6, 3
TCFG = TrainConfig(nft_beta=0.1, kl_beta=0.5, adv_clip=5.0)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    pipe = load_pipeline(str(tiny_model_dir), text_encoders=False)
    tr = pipe.transformer
    add_lora_adapters(tr, rank=4, alpha=8, targets=SD3_LORA_TARGETS, seed=0)
    gen = torch.Generator().manual_seed(1)
    # Three distinct policies: default (theta), old, and the base (ref, adapters off).
    for name, spread in (("default", 0.05), ("old", 0.08)):
        state = adapter_state(tr, name)
        state = {k: (torch.randn(v.shape, generator=gen) * spread if "lora_B" in k else v)
                 for k, v in state.items()}
        load_adapter_state(tr, name, state)
    return tr, trainable_lora_parameters(tr)


def _batch(tr) -> MicroBatch:
    gen = torch.Generator().manual_seed(2)
    cfg = tr.config
    x0 = torch.randn(B, cfg.in_channels, 8, 8, generator=gen)
    sigma = torch.rand(B, generator=gen) * 0.8 + 0.1
    adv = torch.randn(B, K, generator=gen) * 2
    adv[[0, 2, 3], 1] = float("nan")  # reward 1 applies to rows 1, 4, 5 only
    adv[[1, 2, 4, 5], 2] = float("nan")  # reward 2 to rows 0, 3 only
    avg = torch.nanmean(adv, dim=1)
    avg[2] = float("nan")  # a row no reward applies to
    return MicroBatch(
        x0=x0, x_t=forward_process(x0, torch.randn(x0.shape, generator=gen), sigma), sigma=sigma,
        prompt_embeds=torch.randn(B, 12, cfg.joint_attention_dim, generator=gen),
        pooled=torch.randn(B, cfg.pooled_projection_dim, generator=gen),
        advantages=adv, avg_advantage=avg)


def test_forward_process_by_hand_per_sample():
    """x_t = (1 - sigma) x0 + sigma eps per sample (spec §4): hand values, not the helper.

    sigma = 0 is the clean latent, sigma = 1 pure noise; 0.25 weighs x0 by 3/4. Swapping
    sigma and 1 - sigma (the other flow convention) fails all three rows."""
    x0 = torch.tensor([[2.0, -4.0], [2.0, -4.0], [2.0, -4.0]]).view(3, 1, 1, 2)
    eps = torch.tensor([[10.0, 6.0], [10.0, 6.0], [10.0, 6.0]]).view(3, 1, 1, 2)
    x_t = forward_process(x0, eps, torch.tensor([0.0, 1.0, 0.25]))
    expected = torch.tensor([[2.0, -4.0], [10.0, 6.0], [0.75 * 2 + 2.5, 0.75 * -4 + 1.5]])
    assert torch.equal(x_t.view(3, 2), expected)


def _v(tr, batch, adapter):
    """The transformer's velocity, called directly: adapter name, or None for the base."""
    kwargs = dict(hidden_states=batch.x_t, timestep=batch.sigma * 1000.0,
                  encoder_hidden_states=batch.prompt_embeds, pooled_projections=batch.pooled,
                  return_dict=False)
    if adapter is None:
        tr.disable_adapters()
        try:
            with torch.no_grad():
                return tr(**kwargs)[0]
        finally:
            tr.enable_adapters()
    tr.set_adapter(adapter)
    if adapter != "default":
        with torch.no_grad():
            out = tr(**kwargs)[0]
        tr.set_adapter("default")
        return out
    return tr(**kwargs)[0]


def _per_sample_nft(v_theta, v_old, batch, adv):
    beta, c = TCFG.nft_beta, TCFG.adv_clip
    r = (adv.clamp(-c, c) / c / 2 + 0.5).clamp(0, 1)
    t = batch.sigma.view(-1, 1, 1, 1)
    out = []
    for v in (beta * v_theta + (1 - beta) * v_old, (1 + beta) * v_old - beta * v_theta):
        err = batch.x_t - t * v - batch.x0
        w = err.detach().double().abs().mean(dim=(1, 2, 3)).clamp(min=1e-5).view(-1, 1, 1, 1)
        out.append((err.double() ** 2 / w).mean(dim=(1, 2, 3)))
    return (c / beta) * (r * out[0] + (1 - r) * out[1])


def _hand_loss(v_theta, v_old, v_ref, batch, method, scale, ignore_masks=False):
    kl = TCFG.kl_beta * ((v_theta - v_ref) ** 2).mean(dim=(1, 2, 3)).mean()
    if method == "weighted_sum":
        valid = torch.isfinite(batch.avg_advantage) | ignore_masks
        loss = _per_sample_nft(v_theta, v_old, batch, torch.nan_to_num(batch.avg_advantage))
        policy = loss[valid].sum() / valid.sum()
    else:  # equal_alpha with exact masking: sum_k (1/K) masked mean of loss_i(r_ik)
        policy = 0.0
        for k in range(K):
            adv = batch.advantages[:, k]
            valid = torch.isfinite(adv) | ignore_masks
            loss = _per_sample_nft(v_theta, v_old, batch, torch.nan_to_num(adv))
            policy = policy + loss[valid].sum() / valid.sum() / K
    return scale * (policy + kl.double())


def _flat(grads):
    return torch.cat([g.reshape(-1) for g in grads]).double()


@pytest.mark.parametrize("method", ["weighted_sum", "equal_alpha"])
def test_lora_gradient_equals_hand_built_nft_plus_kl(model, method):
    tr, params = model
    batch, scale = _batch(tr), 0.25
    bcfg = BalancerConfig(method=method, exact_masking=True, diagnostics_every=10**9)
    balancer = build_balancer(bcfg, [f"r{k}" for k in range(K)])
    for p in params:
        p.grad = None
    step = build_micro_step(tr, batch, TCFG, params, make_precision("no", torch.device("cpu")),
                            scale=scale, global_step=3, micro_index=1)
    balancer.backward(step)
    got = _flat([p.grad for p in params])
    for p in params:
        p.grad = None

    v_theta = _v(tr, batch, "default")
    v_old, v_ref = _v(tr, batch, "old"), _v(tr, batch, None)

    def grad_of(loss):
        return _flat(torch.autograd.grad(loss, params, retain_graph=True))

    want = grad_of(_hand_loss(v_theta, v_old, v_ref, batch, method, scale))
    assert want.norm() > 0
    # The micro-step runs in float32: an element near zero carries float32 rounding of the largest
    # terms (eps 1.2e-7 x max), so atol is 1e-6 x max; the wrong losses below differ 1000x more.
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * float(want.abs().max()))
    # The comparison is sharp enough to catch the bugs it guards against.
    for wrong in (grad_of(_hand_loss(v_theta, v_ref, v_old, batch, method, scale)),
                  grad_of(_hand_loss(v_theta, v_old, v_ref, batch, method, scale, True))):
        assert (wrong - got).norm() > 1e-3 * got.norm()


def test_fp16_micro_step_scales_grads(model):
    """Under the GradScaler .grad holds scale x the gradient (the scaler's own factor)."""
    tr, params = model
    batch = _batch(tr)
    grads = {}
    for mp in ("no", "fp16"):
        precision = make_precision(mp, torch.device("cpu"))
        for p in params:
            p.grad = None
        balancer = build_balancer(BalancerConfig(method="weighted_sum", diagnostics_every=10**9),
                                  ["a", "b", "c"])
        balancer.backward(build_micro_step(tr, batch, TCFG, params, precision, scale=1.0,
                                           global_step=0, micro_index=1,
                                           grad_scaler=precision.scaler))
        grads[mp] = _flat([p.grad for p in params])
    ratio = grads["fp16"].norm() / grads["no"].norm()
    assert ratio == pytest.approx(65536.0, rel=0.05)  # fp16 autocast noise, not the scale


def test_timestep_stays_fp32_over_bf16_weights(tiny_model_dir):
    """The reference feeds fp32 timesteps; sigma*1000 cast to bf16 would round 955.5 to 956."""
    from marble.models.encode import velocity

    tr = load_pipeline(str(tiny_model_dir), transformer_dtype=torch.bfloat16,
                       text_encoders=False).transformer
    assert next(tr.parameters()).dtype == torch.bfloat16
    batch = _batch(tr)
    seen = []
    hook = tr.register_forward_pre_hook(
        lambda mod, args, kwargs: seen.append(kwargs["timestep"]), with_kwargs=True)
    try:
        with torch.no_grad():
            velocity(tr, batch.x_t, torch.full((B,), 0.9555), batch.prompt_embeds, batch.pooled)
    finally:
        hook.remove()
    assert seen[0].dtype == torch.float32 and float(seen[0][0]) == pytest.approx(955.5)
