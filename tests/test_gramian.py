"""The `gramian` balancer (torchjd weightings on MARBLE's Gram matrix) and an independent
check of our QP (`min_norm_weights`) against torchjd's MGDA weighting.

torchjd's MGDA is Sener & Koltun's plain Frank-Wolfe: linear convergence when the optimum
is interior to its face, O(1/t) when it lies on the simplex's boundary (measured: an
objective gap of ~3e-4 after 3000 iterations, ~5e-5 after 20000, on K = 5..8). So the
check runs it twice: on the full Gramian (it never beats our optimum, and comes close), and
on the face our solution picked (there it converges: the same weights, or at ties of
rank-deficient Gramians the same objective, within 1e-4).
"""

from __future__ import annotations

import builtins
from types import SimpleNamespace

import numpy as np
import pytest
from extras import needs
import torch

from marble.balancers import build_balancer
from marble.balancers.common import MicroStep, reward_loss
from marble.balancers.solve import combine
from marble.balancers.weightings import WEIGHTINGS
from marble.config import ConfigError, load_config
from marble.maths.qp import min_norm_weights

torchjd = needs("torchjd.aggregation", "zoo", module_level=True)


def _unit_rows(rng, k: int, d: int, tie: bool = False) -> np.ndarray:
    x = rng.standard_normal((k, d))
    if tie:  # two rewards with (almost) the same gradient
        x[1] = x[0] + 1e-6 * rng.standard_normal(d)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _cases():
    rng = np.random.default_rng(20260)
    for k in range(2, 9):
        yield k, "full rank", _unit_rows(rng, k, k + 3)
        yield k, "rank-deficient", _unit_rows(rng, k, max(1, k - 2))
        yield k, "near-tie", _unit_rows(rng, k, k + 3, tie=True)


def test_torchjd_mgda_agrees_with_our_qp():
    full_fw = torchjd.MGDAWeighting(epsilon=1e-12, max_iters=150)
    face_fw = torchjd.MGDAWeighting(epsilon=1e-8, max_iters=2000)
    for k, kind, x in _cases():
        g = x @ x.T
        ours = min_norm_weights(g)
        f_ours = ours @ g @ ours
        theirs = full_fw(torch.tensor(g)).numpy()
        f_theirs = theirs @ g @ theirs
        assert f_theirs >= f_ours - 1e-12, (k, kind, f_theirs, f_ours)  # ours is the optimum
        assert f_theirs - f_ours < 1e-2, (k, kind, f_theirs, f_ours)
        face = np.flatnonzero(ours > 1e-9)
        on_face = face_fw(torch.tensor(g[np.ix_(face, face)])).numpy()
        f_face = on_face @ g[np.ix_(face, face)] @ on_face
        same_weights = np.abs(on_face - ours[face]).max() <= 1e-4
        assert same_weights or abs(f_face - f_ours) <= 1e-4, (k, kind, on_face, ours)
        if kind == "full rank":  # a unique optimum: the weights themselves agree
            assert same_weights, (k, kind, on_face, ours)


def test_masked_reward_gets_no_weight_in_either_solver():
    """A reward absent from the micro-batch has a zero gradient: both solvers run on the
    others' Gramian only (the balancer's path: solve.combine)."""
    rng = np.random.default_rng(3)
    x = _unit_rows(rng, 5, 8) * np.array([[1.0], [2.0], [0.5], [1.0], [3.0]])
    x[2] = 0.0  # masked
    grads = [torch.tensor(v) for v in x]
    gram = torch.tensor(x @ x.T)
    cfg = load_config("tiny", [], ["balancer.method=gramian", "balancer.weighting=mgda",
                                   "balancer.weighting_options={epsilon: 1.0e-12, "
                                   "max_iters: 4000}"])
    bal = build_balancer(cfg.balancer, [f"r{i}" for i in range(5)])
    step = SimpleNamespace(global_step=0, micro_index=0)
    d_ours, a_ours, *_ = combine(grads, gram, 1e-12)
    d_tj, a_tj, failed, _, valid = combine(grads, gram, 1e-12,
                                           lambda ug, idx: bal.solve_weights(step, ug, idx))
    assert not failed and not valid[2] and a_ours[2] == 0 and a_tj[2] == 0
    units = x[valid] / np.linalg.norm(x[valid], axis=1, keepdims=True)
    f = [a[valid] @ (units @ units.T) @ a[valid] for a in (a_ours, a_tj)]
    assert abs(f[0] - f[1]) <= 1e-4 and f[1] >= f[0] - 1e-12


def test_every_weighting_is_a_torchjd_class_and_gives_k_finite_weights():
    g = np.array([[1.0, 0.3, -0.4], [0.3, 1.0, 0.2], [-0.4, 0.2, 1.0]])
    step = SimpleNamespace(global_step=2, micro_index=0)
    for name, spec in WEIGHTINGS.items():
        assert hasattr(torchjd, spec.torchjd_class), name
        cfg = load_config("tiny", [], ["balancer.method=gramian", f"balancer.weighting={name}"])
        bal = build_balancer(cfg.balancer, cfg.reward_names)
        w = bal.solve_weights(step, g, (0, 1, 3))
        assert w.shape == (3,) and np.isfinite(w).all(), name
        # seeded by the step (PCGrad's order, random's draw): the same step, the same w
        assert np.array_equal(w, bal.solve_weights(step, g, (0, 1, 3))), name
        if spec.simplex:
            assert (w >= 0).all() and abs(w.sum() - 1) < 1e-9, name
    upgrad = build_balancer(load_config("tiny", [], ["balancer.method=gramian",
                                                     "balancer.weighting=upgrad"]).balancer,
                            ["a", "b"])
    # UPGrad (hand): orthogonal unit gradients are their own projections, w = (1/2, 1/2)
    assert np.allclose(upgrad.solve_weights(step, np.eye(2), (0, 1)), [0.5, 0.5], atol=1e-6)


def test_refusals_are_one_line():
    with pytest.raises(ConfigError, match="exact_masking: true"):
        cfg = load_config("tiny", [], ["balancer.method=gramian", "balancer.weighting=upgrad",
                                       "balancer.exact_masking=false"])
        build_balancer(cfg.balancer, cfg.reward_names)
    with pytest.raises(ConfigError, match="expected one of mgda, upgrad"):
        cfg = load_config("tiny", [], ["balancer.method=gramian", "balancer.weighting=adam"])
        build_balancer(cfg.balancer, cfg.reward_names)
    with pytest.raises(ConfigError, match="only with it"):
        load_config("tiny", [], ["balancer.weighting=upgrad"])


def test_without_torchjd_the_error_names_the_install(monkeypatch):
    real = builtins.__import__

    def no_torchjd(name, *args, **kwargs):
        if name.startswith("torchjd"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torchjd)
    monkeypatch.setattr("importlib.import_module", lambda n: no_torchjd(n))
    cfg = load_config("tiny", [], ["balancer.method=gramian", "balancer.weighting=mgda"])
    with pytest.raises(ConfigError) as err:
        build_balancer(cfg.balancer, cfg.reward_names)
    hint = 'pip install -c site-torch.txt -c workflow/envs/constraints.txt -e ".[zoo]"'  # keeps the site's torch
    assert hint in str(err.value) and "\n" not in str(err.value)


def test_nash_mtl_state_round_trips_through_a_checkpoint():
    cfg = load_config("tiny", [], ["balancer.method=gramian", "balancer.weighting=nash_mtl"])
    g = np.array([[1.0, 0.1, -0.3], [0.1, 1.0, 0.4], [-0.3, 0.4, 1.0]])
    g2 = np.array([[1.0, -0.2, 0.1], [-0.2, 1.0, 0.3], [0.1, 0.3, 1.0]])
    step = SimpleNamespace(global_step=0, micro_index=0)
    a = build_balancer(cfg.balancer, cfg.reward_names)
    a.solve_weights(step, g, (0, 1, 2))
    b = build_balancer(cfg.balancer, cfg.reward_names)
    b.load_state_dict(a.state_dict())
    # the second solve warm-starts from the first one's solution in both
    assert np.array_equal(a.solve_weights(step, g2, (0, 1, 2)),
                          b.solve_weights(step, g2, (0, 1, 2)))
    assert "0,1,2" in b.state_dict()["weighting_state"]


def test_signed_weights_amortize_as_the_weighted_sum_of_masked_losses():
    """IMTL-G / Aligned-MTL may give w_k < 0: the one-backward objective is still
    sum_k w_k L_k (hand: per-sample loss l_i(r) = r x_i, L_k = masked mean)."""
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    adv = torch.tensor([[0.5, float("nan")], [-1.0, 1.0], [0.0, 2.0]])
    step = MicroStep(loss_per_sample=lambda r: r * x, kl=torch.zeros(()), advantages=adv,
                     avg_advantage=torch.zeros(3), scale=1.0, params=[x], global_step=5,
                     micro_index=1, adv_clip=5.0)
    cfg = load_config("tiny", [], ["balancer.method=gramian", "balancer.weighting=imtl_g"])
    bal = build_balancer(cfg.balancer, ["a", "b"])
    bal.alpha_cache = np.array([1.5, -0.5])
    want = 1.5 * reward_loss(step, 0) - 0.5 * reward_loss(step, 1)
    assert torch.allclose(bal.policy_loss(step), want)
    # r = A / 2C + 1/2, C = 5: L_a = (0.55 + 2 * 0.4 + 3 * 0.5) / 3, L_b = (2 * 0.6 + 3 * 0.7) / 2
    assert float(want) == pytest.approx(1.5 * 2.85 / 3 - 0.5 * 3.3 / 2)


def test_train_refuses_a_bad_weighting_before_the_model_loads(tmp_path, capsys):
    from marble.train import main as train_main

    (tmp_path / "model").mkdir()
    (tmp_path / "train.parquet").write_bytes(b"")
    argv = ["--preset", "tiny_zoo_upgrad", "--output-dir", str(tmp_path / "run"),
            "--set", f"model.path={tmp_path / 'model'}",
            "--set", f"data.train={tmp_path / 'train.parquet'}",
            "--set", "balancer.weighting_options={bogus: 1}"]
    with pytest.raises(SystemExit) as code:
        train_main(argv)
    err = capsys.readouterr().err.strip()
    assert code.value.code == 2 and "UPGradWeighting" in err and "bogus" in err
    assert len(err.splitlines()) == 1


def test_random_weighting_draws_differ_by_run_seed_and_repeat_within_one():
    """Issue 36 item 7: zoo_random's draws keyed on the weighting, step and micro-step only were
    the same for every seed of the experiment; the run's train.seed is part of the key now."""
    cfg = load_config("tiny", [], ["balancer.method=gramian", "balancer.weighting=random"])
    g, step = np.eye(3), SimpleNamespace(global_step=4, micro_index=1)
    w = {seed: build_balancer(cfg.balancer, cfg.reward_names, seed=seed).solve_weights(step, g, (0, 1, 2))
         for seed in (1, 2)}
    assert not np.allclose(w[1], w[2])
    again = build_balancer(cfg.balancer, cfg.reward_names, seed=1).solve_weights(step, g, (0, 1, 2))
    assert np.array_equal(w[1], again)


def test_min_norm_tolerance_is_a_property_of_the_balancer_not_its_name():
    """Issue 36 item 7: the claim's full-solve theorem was asked of methods named marble/mgda
    only, so zoo_mgda (torchjd's MGDA, a min-norm solver) skipped it."""
    from marble.balancers import min_norm_tolerance
    from marble.experiments.claim_cli import min_norm_arms

    assert min_norm_tolerance("marble") == min_norm_tolerance("mgda") == 1e-6
    assert min_norm_tolerance("gramian", "mgda") == WEIGHTINGS["mgda"].min_norm_tol == 1e-3
    assert min_norm_tolerance("gramian", "upgrad") is None and min_norm_tolerance("weighted_sum") is None
    cfg = load_config("tiny", [], ["balancer.method=gramian", "balancer.weighting=mgda"])
    assert build_balancer(cfg.balancer, cfg.reward_names).min_norm_tol == 1e-3
    settings = {"marble_n5": {"method": "marble"}, "zoo_mgda": {"method": "gramian", "weighting": "mgda"},
                "zoo_upgrad": {"method": "gramian", "weighting": "upgrad"},
                "weighted_sum": {"method": "weighted_sum"}}
    assert min_norm_arms(settings) == {"marble_n5": 1e-6, "zoo_mgda": 1e-3}
