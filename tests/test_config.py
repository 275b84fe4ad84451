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


def test_every_numeric_key_has_one_range_line():
    """The walk of the typed tree: a numeric key without a line in RANGES fails here (so a new
    key is one line there), and so does a line naming no key (a renamed key)."""
    from marble.config import RunConfig
    from marble.config_ranges import RANGES, literal_keys, numeric_keys

    numeric = numeric_keys(RunConfig)
    assert "train.nft_beta" in numeric and "rewards.weight" in numeric and "train.adam_betas" in numeric
    assert sorted(set(numeric) - set(RANGES)) == [], "add a line to marble.config_ranges.RANGES"
    strings = ["train.reward_device"]  # enumerated, but a str (cuda:N): ranged too
    assert sorted(set(RANGES) - set(numeric)) == strings
    # the Literal keys are ranged by their type (test_wrong_type_and_bad_choice_are_named)
    assert "balancer.full_solve" in literal_keys(RunConfig) and not set(literal_keys(RunConfig)) & set(RANGES)


def _set(cfg, key: str, value) -> str:
    """Set `key` (in a list section: its first item) on a RunConfig; the path a message names."""
    *parents, last = key.split(".")
    node, path = cfg, []
    for part in parents:
        node = getattr(node, part)
        path.append(part)
        if isinstance(node, list):
            node, path[-1] = node[0], f"{part}[0]"
    setattr(node, last, value)
    return ".".join(path + [last])


def test_a_value_out_of_range_is_one_line_naming_its_key():
    """Each rule's values just outside it: one line, the key named, from `validate` (what
    load_config runs after building the tree; `train.nft_beta: 0` once loaded and divided by
    zero mid-run). In-memory edits of one loaded tree: ~70 cases in well under a second."""
    import copy

    from marble.config import validate
    from marble.config_ranges import RANGES

    base = load_config("tiny_sequential")  # tiny with `stages`: their keys are ranged too
    tried, wrong = 0, []
    for key, rule in RANGES.items():
        for bad in rule.outside:
            cfg = copy.deepcopy(base)
            path = _set(cfg, key, bad)
            try:
                validate(cfg, "run.yaml")
                wrong.append(f"{path} = {bad!r} passed")
            except ConfigError as exc:
                text = str(exc)
                if not text.startswith(f"run.yaml: `{path}` = ") or "\n" in text or "must be" not in text:
                    wrong.append(text)
            tried += 1
    assert not wrong, wrong
    assert tried >= 60  # every rule but the seed's has values outside it
    # and through load_config itself, from --set and from a file
    with pytest.raises(ConfigError, match=r"--set train\.nft_beta=0: `train\.nft_beta` = 0\.0 must be > 0"):
        load_config("tiny", overrides=["train.nft_beta=0"])
    with pytest.raises(ConfigError, match=r"`train\.adam_betas\[1\]` = nan must be a finite number"):
        load_config("tiny", overrides=["train.adam_betas=[0.9, .nan]"])
    with pytest.raises(ConfigError, match=r"`train\.adam_betas` = \[0\.9, 0\.9, 0\.9\] must be 2 values"):
        load_config("tiny", overrides=["train.adam_betas=[0.9, 0.9, 0.9]"])


def test_the_range_edges_load():
    """The closed ends of each interval are in range (the checks are not off by one)."""
    edges = ["train.timestep_fraction=1", "balancer.alpha_ema=0", "train.ema_decay=1", "train.ema_decay=0",
             "train.old_decay_cap=0", "train.keep_checkpoints=0", "balancer.warmup_steps=0",
             "train.old_decay_type=0", "train.seed=-3", "train.reward_device=cuda:12",
             "balancer.diagnostics_every=0", "train.adam_betas=[0, 0.999]"]
    for item in edges:
        load_config("tiny", overrides=[item])


def test_all_reward_weights_zero_is_refused(tmp_path):
    import yaml

    from marble.config import preset_dict

    data = preset_dict("tiny")
    for spec in data["rewards"]:
        spec["weight"] = 0
    f = tmp_path / "run.yaml"
    f.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"every `rewards\[\]\.weight` is 0"):
        load_config(files=[f])
    data["rewards"][0]["weight"] = 0.5  # one weight suffices
    f.write_text(yaml.safe_dump(data))
    load_config(files=[f])
