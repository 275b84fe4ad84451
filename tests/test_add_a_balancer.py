"""A new balancer is its strategy class plus its descriptor (docs/ARCHITECTURE.md, "Add a
balancer"): registered through `marble.balancers.register` alone, `tests/balancer_probe.py` is
accepted by the config, priced by the cost cadence, shown by the claim's table and trained
with by the tiny trainer; a method nobody registered is an error everywhere, never priced as
another."""

from __future__ import annotations

import json

import pytest
from balancer_probe import DESCRIPTOR, METHOD, FirstReward
from tiny_tables import three_prompt_table

from marble import balancers
from marble.balancers import cadence
from marble.config import ConfigError, load_config


@pytest.fixture
def probe():
    balancers.register(DESCRIPTOR, FirstReward)
    yield DESCRIPTOR
    balancers.unregister(METHOD)


def test_unregistered_it_is_refused_and_never_priced():
    with pytest.raises(ConfigError, match=f"`balancer.method` = '{METHOD}' is not one of"):
        load_config("tiny", overrides=[f"balancer.method={METHOD}"])
    with pytest.raises(KeyError, match=f"unknown balancer '{METHOD}'"):
        cadence.kind_row(METHOD, "retain", False, False)  # once priced silently as marble
    with pytest.raises(ValueError, match="is not the descriptor's"):
        balancers.register(DESCRIPTOR, balancers.STRATEGIES["marble"])


def test_methods_follow_the_registry_in_both_modules():
    """`marble.balancers.METHODS` and `marble.balance.METHODS` are the live registry's names,
    not a snapshot taken at import: a balancer registered later is listed, one removed is not."""
    from marble import balance

    assert METHOD not in balancers.METHODS and METHOD not in balance.METHODS
    try:
        balancers.register(DESCRIPTOR, FirstReward)
        assert METHOD in balancers.METHODS and METHOD in balance.METHODS
        assert balancers.METHODS == balance.METHODS == tuple(balancers.STRATEGIES)
    finally:
        balancers.unregister(METHOD)
    assert METHOD not in balancers.METHODS and METHOD not in balance.METHODS
    assert "marble" in balance.METHODS  # the built-in ones stay


def test_config_builds_and_the_cadence_prices_it(probe):
    cfg = load_config("tiny", overrides=[f"balancer.method={METHOD}", "train.max_steps=3"])
    bal = balancers.build_balancer(cfg.balancer, cfg.reward_names)
    assert isinstance(bal, FirstReward) and bal.fixed_alpha.tolist() == [1.0, 0.0, 0.0, 0.0]
    kinds = cadence.micro_step_kinds(cfg)
    assert set(kinds) <= {(False, False), (False, True)} and sum(kinds.values()) > 0  # no solve
    # its descriptor's cadence: an amortized step, priced by the `marble` row
    assert cadence.kind_row(METHOD, "retain", False, False) == "marble"
    rows = {"weighted_sum": 1.0, "marble": 1.25, "marble_diag": 3.0}
    plain = kinds[(False, False)]
    over = cadence.run_overhead(cfg, rows)
    assert over["flops"] == pytest.approx(plain * 1.25 + kinds[(False, True)] * 3.0)


def test_the_claims_table_reads_its_descriptor(probe, monkeypatch):
    """The claim's anti-aligned table shows N and the alpha EMA for a cached method only: the
    descriptor's `cached`, not a list of method names."""
    from dataclasses import replace

    from marble.config_balancers import BALANCERS
    from marble.report.verdict_frames import anti_frame

    empty = {k: None for k in ("applied", "full_solve", "amortized", "fresh_solve", "alpha_unit", "alpha_raw")}
    verdict = {"published_anti_aligned": {}, "arms": ["probe"],
               "arm_results": {"probe": {"anti_aligned": empty, "angles": {"angle_applied_solve": None}}},
               "arm_settings": {"probe": {"method": METHOD, "amortize_every": 4, "alpha_ema": 0.7}}}
    assert anti_frame(verdict).loc["probe", "N"] == "-"
    monkeypatch.setitem(BALANCERS, METHOD, replace(DESCRIPTOR, cached=True))
    assert anti_frame(verdict).loc["probe", "N"] == 4


def test_a_tiny_training_runs_with_it(probe, tiny_model_dir, tmp_path):
    from marble.train import main as train_main

    table = three_prompt_table(tmp_path / "train.parquet")
    sets = [f"model.path={tiny_model_dir}", f"data.train={table}", "sampling.num_steps=2",
            "sampling.resolution=32", "sampling.images_per_prompt=2", "sampling.batch_size=6",
            "sampling.num_batches_per_epoch=1", "train.batch_size=3", f"balancer.method={METHOD}"]
    run = tmp_path / "run"
    assert train_main(["--preset", "tiny", "--output-dir", str(run), "--no-progress", "--max-steps", "1",
                       *[x for s in sets for x in ("--set", s)]]) == 0
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    alphas = {k: v for k, v in last.items() if k.startswith("alpha/")}
    assert alphas and alphas.pop("alpha/toy_brightness") == 1.0 and set(alphas.values()) == {0.0}, last
