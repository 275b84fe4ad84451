"""The DiffusionNFT loss on a 1x1x1x2 example computed by hand."""

import pytest
import torch

from marble.maths.nft import kl_loss, nft_loss_from_terms, nft_terms, optimality_prob


def nft_loss(v_theta, v_old, x0, x_t, t, r, beta, adv_clip=5.0):
    """The per-sample DiffusionNFT loss as the micro-step composes it (terms, then r)."""
    return nft_loss_from_terms(*nft_terms(v_theta, v_old, x0, x_t, t, beta), r, beta, adv_clip)


def test_optimality_prob_clips_and_maps():
    adv = torch.tensor([-7.0, -5.0, 0.0, 2.5, 5.0, 9.0])
    torch.testing.assert_close(optimality_prob(adv), torch.tensor([0, 0, 0.5, 0.75, 1, 1.0]))
    torch.testing.assert_close(optimality_prob(torch.tensor([1.0]), adv_clip=2.0),
                               torch.tensor([0.75]))
    assert torch.isnan(optimality_prob(torch.tensor([float("nan")]))).all()
    with pytest.raises(ValueError, match="adv_clip"):
        optimality_prob(adv, adv_clip=0.0)


def _hand_example():
    x0 = torch.tensor([[[[1.0, 2.0]]]], dtype=torch.float64)
    x_t = torch.tensor([[[[0.5, 1.5]]]], dtype=torch.float64)
    v_theta = torch.tensor([[[[3.0, 0.0]]]], dtype=torch.float64, requires_grad=True)
    v_old = torch.tensor([[[[1.0, 1.0]]]], dtype=torch.float64)
    t = torch.tensor([0.5], dtype=torch.float64)
    return v_theta, v_old, x0, x_t, t


def test_nft_terms_and_loss_by_hand():
    v_theta, v_old, x0, x_t, t = _hand_example()
    beta = 0.5
    # v+ = .5 [3,0] + .5 [1,1] = [2, .5];  v- = 1.5 [1,1] - .5 [3,0] = [0, 1.5]
    # x0+ = x_t - .5 v+ = [-.5, 1.25] -> err+ = [-1.5, -.75], w+ = 1.125
    # x0- = [.5, .75] -> err- = [-.5, -1.25], w- = .875
    l_pos, l_neg = nft_terms(v_theta, v_old, x0, x_t, t, beta)
    torch.testing.assert_close(l_pos, torch.tensor([(2.25 + 0.5625) / 2 / 1.125],
                                                   dtype=torch.float64))
    torch.testing.assert_close(l_neg, torch.tensor([(0.25 + 1.5625) / 2 / 0.875],
                                                   dtype=torch.float64))
    loss = nft_loss(v_theta, v_old, x0, x_t, t, torch.tensor([0.8]), beta, adv_clip=5.0)
    expected = 10.0 * (0.8 * 1.25 + 0.2 * (0.90625 / 0.875))  # (C / beta) = 10
    torch.testing.assert_close(loss, torch.tensor([expected], dtype=torch.float64))
    # Gradient with the weights held fixed (stop-grad):
    # dl+/dv = -t beta err+ / w+ ; dl-/dv = +t beta err- / w-
    loss.sum().backward()
    g_pos = torch.tensor([0.375, 0.1875]) / 1.125
    g_neg = torch.tensor([-0.125, -0.3125]) / 0.875
    expected_grad = 10.0 * (0.8 * g_pos + 0.2 * g_neg)
    torch.testing.assert_close(v_theta.grad.reshape(-1), expected_grad.double())


def test_nft_weights_are_floored():
    x0 = torch.zeros(1, 1, 1, 2)
    v = torch.zeros(1, 1, 1, 2)
    l_pos, l_neg = nft_terms(v, v, x0, x0 + 1e-7, torch.tensor([0.5]), 0.1)
    # err = 1e-7 everywhere: mean err^2 / max(1e-7, 1e-5) = 1e-14 / 1e-5. Relative
    # tolerance only: the default atol (1e-5) would accept any floor at these magnitudes.
    torch.testing.assert_close(l_pos, torch.tensor([1e-9]), rtol=1e-5, atol=0)
    torch.testing.assert_close(l_neg, torch.tensor([1e-9]), rtol=1e-5, atol=0)


def test_nft_loss_is_per_sample_with_broadcast_t():
    torch.manual_seed(0)
    shape = (3, 2, 2, 2)
    v_theta, v_old, x0, noise = (torch.randn(shape) for _ in range(4))
    t = torch.tensor([0.2, 0.5, 0.9])
    x_t = (1 - t.view(-1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1) * noise
    r = torch.tensor([0.1, 0.5, 1.0])
    batch = nft_loss(v_theta, v_old, x0, x_t, t, r, 0.1)
    for i in range(3):
        one = nft_loss(v_theta[i:i + 1], v_old[i:i + 1], x0[i:i + 1], x_t[i:i + 1],
                       t[i:i + 1], r[i:i + 1], 0.1)
        torch.testing.assert_close(batch[i:i + 1], one)
    l_pos, l_neg = nft_terms(v_theta, v_old, x0, x_t, t, 0.1)
    torch.testing.assert_close(nft_loss_from_terms(l_pos, l_neg, r, 0.1), batch)
    with pytest.raises(ValueError, match="shape mismatch"):
        nft_terms(v_theta, v_old[:2], x0, x_t, t, 0.1)


def test_kl_loss_by_hand():
    v_theta = torch.tensor([[[[3.0, 0.0]]], [[[1.0, 1.0]]]])
    v_ref = torch.tensor([[[[1.0, 2.0]]], [[[1.0, 0.0]]]])
    torch.testing.assert_close(kl_loss(v_theta, v_ref), torch.tensor([4.0, 0.5]))


# ---------------------------------------------------------------- one-evaluation amortized loss

from marble.maths.nft import amortized_coefficients, weighted_loss  # noqa: E402

CLIP, BETA = 5.0, 0.1


def _terms(seed, batch=7):
    """l_pos, l_neg [B] depending on a parameter, in float64."""
    gen = torch.Generator().manual_seed(seed)
    theta = torch.randn(3, dtype=torch.float64, generator=gen, requires_grad=True)
    feats = torch.randn(batch, 3, 2, dtype=torch.float64, generator=gen)
    l_pos = ((feats[..., 0] @ theta) ** 2).reshape(-1)
    l_neg = ((feats[..., 1] @ theta) ** 2 + 0.3).reshape(-1)
    return theta, l_pos, l_neg


def _masked_adv(seed, batch=7, k=4, scale=2.0):
    gen = torch.Generator().manual_seed(seed)
    adv = (torch.rand(batch, k, dtype=torch.float64, generator=gen) * 2 - 1) * scale
    adv[0, 1] = adv[2, 1] = adv[4, 3] = adv[5, 0] = float("nan")
    adv[3, :] = float("nan")  # a sample no reward applies to
    adv[:, 2] = float("nan")  # a specialist reward that applies to one sample only
    adv[6, 2] = 1.5
    return adv


def _k_evaluations(l_pos, l_neg, adv, alpha, exact):
    """sum_k alpha_k L_k with one loss evaluation per reward, written out directly."""
    total = 0.0
    for k, a in enumerate(alpha):
        col = adv[:, k]
        valid = torch.isfinite(col)
        r = optimality_prob(torch.nan_to_num(col, nan=0.0), CLIP)  # NaN -> A = 0 -> r = 1/2
        loss = nft_loss_from_terms(l_pos, l_neg, r, BETA, CLIP)
        if exact:
            total = total + a * loss[valid].sum() / max(int(valid.sum()), 1)
        else:
            total = total + a * loss.mean()
    return total


@pytest.mark.parametrize("exact", [True, False])
def test_one_evaluation_equals_k_evaluations(exact):
    theta, l_pos, l_neg = _terms(0)
    adv, alpha = _masked_adv(1), [0.1, 0.4, 0.2, 0.3]
    calls = []

    def head(r):  # the loss head, counted
        calls.append(r)
        return nft_loss_from_terms(l_pos, l_neg, r, BETA, CLIP)

    r, w = amortized_coefficients(adv, alpha, CLIP, exact_masking=exact)
    one = weighted_loss(head(r), w)
    many = _k_evaluations(l_pos, l_neg, adv, alpha, exact)
    assert len(calls) == 1
    torch.testing.assert_close(one, many, rtol=1e-6, atol=1e-12)
    g_one, = torch.autograd.grad(one, theta, retain_graph=True)
    g_many, = torch.autograd.grad(many, theta)
    torch.testing.assert_close(g_one, g_many, rtol=1e-6, atol=1e-12)
    if exact:  # the sample with no applicable reward carries no weight
        assert float(w[3]) == 0.0 and float(w.sum()) == pytest.approx(1.0)


def test_reference_mode_clips_after_combining():
    """exact_masking=False is the reference's r(clip(sum_k alpha_k nan->0(A_k))), mean over B."""
    adv = torch.tensor([[9.0, -2.0], [float("nan"), 8.0], [-7.0, -6.0]])
    r, w = amortized_coefficients(adv, [0.5, 0.5], CLIP, exact_masking=False)
    combined = torch.tensor([3.5, 4.0, -6.5])
    torch.testing.assert_close(r, optimality_prob(combined, CLIP))
    torch.testing.assert_close(w, torch.full((3,), 1 / 3))


def test_weighted_loss_ignores_masked_non_finite_rows_and_checks_alpha():
    per = torch.tensor([1.0, float("inf"), 3.0])
    assert float(weighted_loss(per, torch.tensor([0.5, 0.0, 0.5]))) == 2.0
    with pytest.raises(ValueError, match="alpha has 3 values for 2 rewards"):
        amortized_coefficients(torch.zeros(4, 2), [0.2, 0.3, 0.5])
