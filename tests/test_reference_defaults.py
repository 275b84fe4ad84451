"""The paper presets reproduce the reference by default; exact masking is a named ablation.

The amortized micro-step of a paper preset is checked against the reference's
combined-advantage formula written out here from docs/algorithm.md ("Amortized step"):
A~_i = sum_k alpha_k nan_to_num(A_ki, 0), r_i = clip(A~_i, -C, C) / 2C + 1/2, and the NFT
loss averaged over all n samples of the micro-batch (no mask), plus the KL term.
"""

from __future__ import annotations

import pytest
import torch

from marble.balancers import MicroStep, build_balancer
from marble.config import PRESET_DIR, dump_yaml, load_config, to_dict
from marble.maths.nft import kl_loss, nft_loss_from_terms, nft_terms

PAPER = ["sd35m", "rho_07", "equal_alpha", "weighted_sum", "full_mgda", "bench_sd35m"]


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in d.items():
        if isinstance(value, dict) and key != "options":
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


@pytest.mark.parametrize("preset", PAPER)
def test_paper_presets_use_the_reference_fill(preset):
    assert load_config(preset).balancer.exact_masking is False


def test_tiny_presets_state_exact_masking():
    # The embedded default keeps our exact masking, and says so in its own file.
    assert "exact_masking: true" in (PRESET_DIR / "tiny.yaml").read_text()
    for name in ("tiny", "tiny_mgda", "tiny_equal_alpha", "tiny_weighted_sum"):
        assert load_config(name).balancer.exact_masking is True


def test_rho_07_exact_differs_from_rho_07_only_in_exact_masking():
    a = _flat(to_dict(load_config("rho_07")))
    b = _flat(to_dict(load_config("rho_07_exact")))
    diff = {k for k in set(a) | set(b) if a.get(k) != b.get(k)}
    assert diff == {"preset", "balancer.exact_masking"}
    assert (a["balancer.exact_masking"], b["balancer.exact_masking"]) == (False, True)
    assert "exact_masking: true" in dump_yaml(load_config("rho_07_exact"))


# ------------------------------------------------------------------ one micro-step

BETA, CLIP, KL_W, SCALE = 0.1, 5.0, 1e-2, 1.0 / 6


def _toy(seed: int = 0, n: int = 6):
    gen = torch.Generator().manual_seed(seed)
    model = torch.nn.Conv2d(2, 2, 1).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64))
    shape = (n, 2, 3, 3)
    x0, noise, v_old, v_ref = (torch.randn(shape, generator=gen, dtype=torch.float64)
                               for _ in range(4))
    t = torch.rand(n, generator=gen, dtype=torch.float64) * 0.7 + 0.2
    x_t = (1 - t.view(-1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1) * noise
    return model, x0, x_t, t, v_old, v_ref


def _reference_grad(model, x0, x_t, t, v_old, v_ref, adv, alpha):
    """The reference's cached-alpha micro-step, written from its formulas."""
    v = model(x_t)
    combined = sum(a * torch.nan_to_num(adv[:, k], nan=0.0) for k, a in enumerate(alpha))
    r = combined.clamp(-CLIP, CLIP) / (2 * CLIP) + 0.5
    tb = t.view(-1, 1, 1, 1)
    e_pos = x_t - tb * (BETA * v + (1 - BETA) * v_old) - x0
    e_neg = x_t - tb * ((1 + BETA) * v_old - BETA * v) - x0
    w_pos = e_pos.detach().abs().mean((1, 2, 3)).clamp(min=1e-5)
    w_neg = e_neg.detach().abs().mean((1, 2, 3)).clamp(min=1e-5)
    l_pos, l_neg = (e_pos ** 2).mean((1, 2, 3)) / w_pos, (e_neg ** 2).mean((1, 2, 3)) / w_neg
    policy = ((CLIP / BETA) * (r * l_pos + (1 - r) * l_neg)).mean()  # all n samples
    kl = KL_W * ((v - v_ref) ** 2).mean()
    grads = torch.autograd.grad(SCALE * (policy + kl), list(model.parameters()))
    return torch.cat([g.reshape(-1) for g in grads])


def _preset_grad(preset, model, x0, x_t, t, v_old, v_ref, adv, alpha):
    cfg = load_config(preset).balancer
    names = [f"r{k}" for k in range(adv.shape[1])]
    balancer = build_balancer(cfg, names)
    # A cache from an earlier full solve: step 1 is amortized (warm-up 1, N = 10).
    balancer.load_state_dict({"method": cfg.method, "reward_names": names,
                              "alpha_cache": list(alpha), "last_full": 0, "last_alpha": None})
    params = list(model.parameters())
    for p in params:
        p.grad = None
    v = model(x_t)
    l_pos, l_neg = nft_terms(v, v_old, x0, x_t, t, BETA)
    step = MicroStep(
        loss_per_sample=lambda r: nft_loss_from_terms(l_pos, l_neg, r, BETA, CLIP),
        kl=KL_W * kl_loss(v, v_ref).mean(), advantages=adv,
        avg_advantage=torch.nanmean(adv, dim=1), scale=SCALE, params=params, global_step=1,
        micro_index=3, adv_clip=CLIP)
    metrics = balancer.backward(step)
    assert metrics["full_solve"] == 0.0
    return torch.cat([p.grad.reshape(-1) for p in params])


def test_paper_micro_step_with_masks_equals_reference_formula():
    model, x0, x_t, t, v_old, v_ref = _toy()
    nan = float("nan")
    # Masked pairs (NaN) in two rewards; one advantage beyond the clip after combining.
    adv = torch.tensor([[0.5, nan, 1.0], [-1.0, 2.0, nan], [0.3, -0.2, 9.0],
                        [1.5, nan, nan], [-0.7, 0.4, -1.2], [2.0, 1.0, 0.1]],
                       dtype=torch.float64)
    alpha = [0.5, 0.2, 0.3]
    ref = _reference_grad(model, x0, x_t, t, v_old, v_ref, adv, alpha)
    got = _preset_grad("rho_07", model, x0, x_t, t, v_old, v_ref, adv, alpha)
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
    # The ablation really is different on the same batch: masks change the update.
    exact = _preset_grad("rho_07_exact", model, x0, x_t, t, v_old, v_ref, adv, alpha)
    assert (exact - ref).norm() > 1e-3 * ref.norm()
