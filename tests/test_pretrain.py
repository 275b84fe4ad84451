"""The pretraining stage of the tiny generator: the synthetic pictures it learns from,
and `marble models pretrain` end to end on a few steps (the output loads and draws)."""

from __future__ import annotations

import json

import pytest
import torch

from marble.models.pretrain import PretrainSettings, draw_toy_image, hsv_to_rgb, picture_set
from marble.rewards.toy import GENEVAL_COLORS, luminance


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_hsv_to_rgb_by_hand():
    assert hsv_to_rgb(0.0, 1.0, 1.0).tolist() == [1.0, 0.0, 0.0]
    assert hsv_to_rgb(1 / 3, 1.0, 0.5).tolist() == pytest.approx([0.0, 0.5, 0.0])
    assert hsv_to_rgb(0.7, 0.0, 0.25).tolist() == pytest.approx([0.25, 0.25, 0.25])


def test_pictures_are_deterministic_and_vary():
    a = draw_toy_image("a fox at sunset", {}, gen(1))
    assert a.shape == (3, 64, 64) and 0 <= a.min() and a.max() <= 1
    assert torch.equal(a, draw_toy_image("a fox at sunset", {}, gen(1)))
    b = draw_toy_image("a fox at sunset", {}, gen(2))
    assert (a - b).abs().mean() > 0.01  # the variation RL advantages need


def test_named_colour_pulls_the_mean_colour():
    red = torch.tensor(GENEVAL_COLORS["red"], dtype=torch.float32) / 255
    meta = {"include": [{"class": "cup", "count": 1, "color": "red"}]}
    dist_named, dist_plain = [], []
    for s in range(20):
        dist_named.append((draw_toy_image("a photo of a red cup", meta, gen(s)).mean((1, 2)) - red).norm())
        dist_plain.append((draw_toy_image("a photo of a red cup", {}, gen(s)).mean((1, 2)) - red).norm())
    assert sum(dist_named) < 0.8 * sum(dist_plain)


def test_quoted_text_draws_contrasting_bars():
    text = [luminance(draw_toy_image('a sign with the words "Open"', {}, gen(s))[None])[0, 42:56].std()
            for s in range(10)]
    plain = [luminance(draw_toy_image("a sign with the words Open", {}, gen(s))[None])[0, 42:56].std()
             for s in range(10)]
    assert sum(text) > 1.5 * sum(plain)


def test_picture_set_cycles_records():
    images, index = picture_set([("a", {}), ("b", {})], 5, seed=0, size=16)
    assert images.shape == (5, 3, 16, 16) and index.tolist() == [0, 1, 0, 1, 0]


def test_pretrain_cli_writes_a_loadable_model(tiny_model_dir, tmp_path, capsys):
    import pandas as pd

    from marble.models.cli import main
    from marble.models.loading import load_pipeline

    table = tmp_path / "train.parquet"
    pd.DataFrame({"prompt_id": ["1", "2"], "prompt": ['a sign "hi"', "a photo of a cup"],
                  "source": ["ocr", "pickscore"], "metadata": ["{}", "{}"]}).to_parquet(table)
    out = tmp_path / "drawn"
    assert main(["pretrain", "--model", str(tiny_model_dir), "--table", str(table), "--out", str(out),
                 "--vae-steps", "2", "--flow-steps", "2", "--batch-size", "4", "--threads", "1"]) == 0
    summary = json.loads((out / "pretrain_summary.json").read_text())
    assert summary["prompts"] == 2 and summary["settings"]["flow_steps"] == 2
    pipe = load_pipeline(str(out))
    before = load_pipeline(str(tiny_model_dir))
    # The VAE's latent normalisation was refitted and the weights moved.
    assert pipe.vae.config.scaling_factor != before.vae.config.scaling_factor
    moved = [not torch.equal(a, b) for a, b in zip(pipe.transformer.parameters(),
                                                   before.transformer.parameters())]
    assert any(moved)
    assert "pretrained" in capsys.readouterr().out


def test_workflow_defaults_match_the_module_defaults():
    """config.yaml / the schema and `marble models pretrain` agree on the default budget."""
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[1]
    schema = yaml.safe_load((root / "workflow/schemas/config.schema.yaml").read_text())
    props = schema["properties"]["pretrain"]["properties"]
    shipped = yaml.safe_load((root / "config.yaml").read_text())["pretrain"]
    s = PretrainSettings()
    for key in ("vae_steps", "flow_steps", "seed"):
        assert props[key]["default"] == shipped[key] == getattr(s, key), key
