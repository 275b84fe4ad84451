"""The typed config tree: presets, overrides, and errors that name the key."""

import pytest

from marble.config import (
    ConfigError,
    available_presets,
    grad_accumulation,
    load_config,
    parse_override,
    training_timesteps,
)


def test_paper_presets_follow_the_spec():
    cfg = load_config("rho_07")
    assert cfg.balancer.method == "marble"
    assert cfg.balancer.alpha_ema == 0.7 and cfg.balancer.amortize_every == 10
    assert cfg.reward_names == ["pickscore", "hpsv2", "clipscore", "ocr", "geneval"]
    assert (cfg.train.nft_beta, cfg.train.kl_beta, cfg.train.adv_clip) == (0.1, 1e-4, 5.0)
    assert cfg.train.old_decay_cap == 0.95 and cfg.model.lora_rank == 32
    # Spec D.8: 8 micro-batches of 9 and 24 training timesteps = 192 backward passes.
    assert grad_accumulation(cfg) == 8 and training_timesteps(cfg) == 24
    assert load_config("equal_alpha").balancer.method == "equal_alpha"
    assert load_config("weighted_sum").balancer.method == "weighted_sum"
    assert load_config("full_mgda").balancer.method == "mgda"


def test_every_preset_loads():
    for name in available_presets():
        assert load_config(name).preset == name


def test_overrides_parse_yaml_values_and_nest():
    assert parse_override("train.lr=1e-3") == {"train": {"lr": 1e-3}}
    cfg = load_config("tiny", overrides=["train.lr=0.01", "balancer.method=mgda"])
    assert cfg.train.lr == 0.01 and cfg.balancer.method == "mgda"
    assert isinstance(load_config("tiny", overrides=["train.lr=1"]).train.lr, float)


def test_unknown_key_is_named():
    with pytest.raises(ConfigError, match=r"unknown config key `train\.lrr`"):
        load_config("tiny", overrides=["train.lrr=1"])
    with pytest.raises(ConfigError, match=r"`rewards\[0\]\.wieght`"):
        load_config("tiny", overrides=["rewards=[{name: a, wieght: 1}]"])


def test_wrong_type_and_bad_choice_are_named():
    with pytest.raises(ConfigError, match=r"`train\.lr` = 'abc' is not a valid float"):
        load_config("tiny", overrides=["train.lr=abc"])
    with pytest.raises(ConfigError, match=r"`balancer\.method`.*one of"):
        load_config("tiny", overrides=["balancer.method=magic"])


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ConfigError, match=r"unknown preset `nope`.*tiny"):
        load_config("nope")


def test_config_file_layers_on_preset(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("base: tiny\ntrain: {max_steps: 3}\n")
    cfg = load_config(files=[f])
    assert cfg.train.max_steps == 3 and cfg.model.path == "data/models/tiny-sd3"
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match="bad.yaml: invalid YAML"):
        load_config("tiny", files=[bad])


def test_cross_field_checks():
    with pytest.raises(ConfigError, match="train.batch_size"):
        load_config("tiny", overrides=["train.batch_size=7"])
    with pytest.raises(ConfigError, match="fixed_alphas"):
        load_config("tiny", overrides=["balancer.fixed_alphas=[0.5, 0.6, 0.1]"])
