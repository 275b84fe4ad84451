"""Weight EMA, alpha EMA and old-policy decay against hand values."""

import numpy as np
import pytest
import torch

from marble.maths.ema import (
    WeightEMA,
    ema_decay,
    old_policy_decay,
    update_alpha_cache,
)


def test_ema_decay_schedule():
    assert ema_decay(0, 0.9) == pytest.approx(0.1)
    assert ema_decay(5, 0.9) == pytest.approx(6 / 15)
    assert ema_decay(100, 0.9) == pytest.approx(0.9)  # 101/110 > 0.9 is capped
    with pytest.raises(ValueError):
        ema_decay(-1, 0.9)


def test_weight_ema_update_swap_and_state():
    p = torch.nn.Parameter(torch.tensor([1.0, -1.0]))
    ema = WeightEMA([p], max_decay=0.9)
    with torch.no_grad():
        p.copy_(torch.tensor([2.0, 3.0]))
    assert ema.update(0) == pytest.approx(0.1)
    expected = 0.1 * torch.tensor([1.0, -1.0]) + 0.9 * torch.tensor([2.0, 3.0])
    torch.testing.assert_close(ema.shadow[0], expected)
    with ema.swapped():
        torch.testing.assert_close(p.detach(), expected)
    torch.testing.assert_close(p.detach(), torch.tensor([2.0, 3.0]))
    other = WeightEMA([torch.nn.Parameter(torch.zeros(2))], max_decay=0.5)
    other.load_state_dict(ema.state_dict())
    assert other.max_decay == 0.9
    torch.testing.assert_close(other.shadow[0], expected)
    with pytest.raises(ValueError, match="shape"):
        WeightEMA([torch.nn.Parameter(torch.zeros(3))]).load_state_dict(ema.state_dict())
    with pytest.raises(ValueError, match="holds 2 tensors, got 1"):
        WeightEMA([p, p]).load_state_dict(ema.state_dict())
    with pytest.raises(ValueError, match="max_decay"):
        other.load_state_dict({**ema.state_dict(), "max_decay": 1.5})


def test_alpha_cache_ema_by_hand():
    cache = update_alpha_cache(None, [0.2, 0.8], rho=0.7)
    np.testing.assert_allclose(cache, [0.2, 0.8])
    cache = update_alpha_cache(cache, [0.6, 0.4], rho=0.7)
    np.testing.assert_allclose(cache, [0.7 * 0.2 + 0.3 * 0.6, 0.7 * 0.8 + 0.3 * 0.4])
    assert cache.sum() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="entries"):
        update_alpha_cache(cache, [1.0], rho=0.7)
    with pytest.raises(ValueError, match="finite"):
        update_alpha_cache(cache, [float("nan"), 1.0], rho=0.7)
    for rho in (1.5, -0.1):  # refused on the first solve too, not only once a cache exists
        with pytest.raises(ValueError, match="rho"):
            update_alpha_cache(None, [0.2, 0.8], rho=rho)


def test_old_policy_decay_types():
    assert old_policy_decay(500, 0, 0.95) == 0.0
    assert old_policy_decay(100, 1, 0.95) == pytest.approx(0.1)
    assert old_policy_decay(2000, 1, 0.95) == pytest.approx(0.95)
    assert old_policy_decay(2000, 1, 0.5) == pytest.approx(0.5)
    assert old_policy_decay(74, 2, 0.95) == 0.0
    assert old_policy_decay(100, 2, 0.95) == pytest.approx(0.1875)
    assert old_policy_decay(1000, 2, 0.95) == pytest.approx(0.999)
    with pytest.raises(ValueError, match="decay_type"):
        old_policy_decay(1, 3, 0.5)


def _reference_ema_sequence(param_values, max_decay):
    """The reference's EMAModuleWrapper as train.py drives it: after each optimizer
    step, global_step += 1, then ema += (1 - min((1+s)/(10+s), decay)) (p - ema)."""
    ema, decays = param_values[0].clone(), []
    for s, value in enumerate(param_values[1:], start=1):  # s: the post-increment step
        d = min((1 + s) / (10 + s), max_decay)
        ema = ema + (1 - d) * (value - ema)
        decays.append(d)
    return ema, decays


def test_ema_decay_sequence_matches_reference_steps_1_to_20():
    """The trainer's order (step += 1, then ema.update(step)) against the reference."""
    from marble.runtime.precision import make_precision, optimizer_update

    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(5))
    opt = torch.optim.SGD([p], lr=0.1)
    ema = WeightEMA([p], max_decay=0.9)
    values, decays, step = [p.detach().clone()], [], 0
    precision = make_precision("no", torch.device("cpu"))
    for _ in range(20):
        p.square().sum().backward()
        optimizer_update([p], opt, precision, max_grad_norm=1e9)
        step += 1
        decays.append(ema.update(step))
        values.append(p.detach().clone())
    ref_shadow, ref_decays = _reference_ema_sequence(values, 0.9)
    assert decays == pytest.approx(ref_decays, abs=0, rel=1e-15)
    assert decays[0] == pytest.approx(2 / 11) and decays[-1] == pytest.approx(21 / 30)
    torch.testing.assert_close(ema.shadow[0], ref_shadow, rtol=1e-6, atol=1e-7)
