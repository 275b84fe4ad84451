"""beds.kernel_sensitivity's pure parts, by hand (the tool itself runs by hand)."""

from __future__ import annotations

import math

import pytest

from beds.kernel_sensitivity import VARIANTS, max_abs_differences, strict_json, variant_env


def test_variant_env_sets_and_removes():
    base = {"ATEN_CPU_CAPABILITY": "avx512", "OMP_NUM_THREADS": "4", "PATH": "/bin"}
    assert variant_env(base, VARIANTS["default"]) == {"OMP_NUM_THREADS": "1", "PATH": "/bin"}
    assert variant_env(base, VARIANTS["avx2"])["ATEN_CPU_CAPABILITY"] == "avx2"
    assert base["ATEN_CPU_CAPABILITY"] == "avx512"  # the caller's mapping is left alone


def test_max_abs_differences_by_hand():
    """Step 1: reward 0.5 vs 0.25 (0.25), loss 1 vs 1; step 2: reward 0.5 vs 0.375 (0.125),
    anti_aligned NaN vs 0 (a value lost: inf), cos_min NaN vs NaN (0); step 3 only on one
    side, `epoch` and `balancer` not compared."""
    nan = float("nan")
    ref = [{"step": 1, "reward/a": 0.5, "loss/policy": 1.0, "epoch": 0, "balancer": "marble"},
           {"step": 2, "reward/a": 0.5, "anti_aligned": nan, "cos_min": nan},
           {"step": 3, "reward/a": 9.0}]
    other = [{"step": 1, "reward/a": 0.25, "loss/policy": 1.0, "epoch": 5},
             {"step": 2, "reward/a": 0.375, "anti_aligned": 0.0, "cos_min": nan}]
    out = max_abs_differences(ref, other)
    assert out == {"anti_aligned": math.inf, "cos_min": 0.0, "loss/policy": 0.0, "reward/a": pytest.approx(0.25)}
    assert strict_json({"x": math.inf, "y": nan, "z": {"w": 1.5}}) == {"x": "inf", "y": None, "z": {"w": 1.5}}
