"""Toy rewards on hand-made images, the registry, and score_all."""

from __future__ import annotations

import math

import pytest
import torch

from marble.rewards import available, build, score_all

COLOR_META = {"source": "geneval", "include": [{"class": "dog", "count": 1, "color": "red"}]}


def solid(rgb, size=8):
    return torch.tensor(rgb, dtype=torch.float32).view(3, 1, 1).expand(3, size, size).clone()


def test_registry_lists_every_reward():
    names = set(available())
    assert {"toy_brightness", "toy_saturation", "toy_color_match", "toy_text_contrast"} <= names
    assert {"pickscore", "clipscore", "aesthetic", "hpsv2", "imagereward", "ocr", "geneval", "unifiedreward"} <= names
    with pytest.raises(KeyError, match="unknown reward 'nope'"):
        build("nope")
    with pytest.raises(TypeError, match="unknown options"):
        build("toy_brightness", bogus=1)


def test_brightness_and_saturation_by_hand():
    images = torch.stack([solid([1, 1, 1]), solid([1, 0, 0]), solid([0, 0, 0]), solid([0.5, 0.25, 0.5])])
    bright = build("toy_brightness")(images, ["p"] * 4)
    sat = build("toy_saturation")(images, ["p"] * 4)
    expected_bright = [1.0, 0.299, 0.0, 0.299 * 0.5 + 0.587 * 0.25 + 0.114 * 0.5]
    assert torch.allclose(bright, torch.tensor(expected_bright), atol=1e-6)
    assert torch.allclose(sat, torch.tensor([0.0, 1.0, 0.0, 0.5]), atol=1e-6)
    assert bright.dtype == torch.float32 and sat.shape == (4,)
    # The conflict: white wins brightness, loses saturation.
    assert bright[0] > bright[1] and sat[0] < sat[1]


def test_color_match_mask_and_values():
    reward = build("toy_color_match")
    images = torch.stack([solid([1, 0, 0]), solid([0, 0, 1]), solid([1, 0, 0])])
    meta = [COLOR_META, COLOR_META, {"source": "pickscore"}]
    out = reward(images, ["a red dog"] * 3, meta)
    assert out[0].item() == pytest.approx(1.0)
    # blue vs red: distance sqrt(2) -> 1 - sqrt(2)/sqrt(3)
    assert out[1].item() == pytest.approx(1 - math.sqrt(2 / 3), abs=1e-6)
    assert math.isnan(out[2].item())
    no_color = {"include": [{"class": "dog", "count": 2}]}
    assert not reward.applies("two dogs", no_color)
    assert reward.failures == 0 and reward.scored == 2


def test_text_contrast_mask_and_values():
    reward = build("toy_text_contrast")
    stripes = torch.zeros(3, 8, 8)
    stripes[:, :, ::2] = 1.0  # alternate columns: |dx| = 1 everywhere, |dy| = 0
    images = torch.stack([stripes, solid([0.3, 0.3, 0.3]), stripes])
    out = reward(images, ['a sign "hi"', 'a sign "x"', "no quotes"], None)
    assert out[0].item() == pytest.approx(0.5, abs=1e-6)
    assert out[1].item() == pytest.approx(0.0, abs=1e-6)
    assert math.isnan(out[2].item())


def test_text_contrast_is_the_rms_luma_contrast():
    from marble.rewards.toy import rms_contrast

    half = torch.full((3, 8, 8), 0.2)
    half[:, :, 4:] = 0.6  # two luma levels, half the pixels each: std = 0.2
    grey_ramp = torch.linspace(0, 1, 8).view(1, 1, 8).expand(3, 8, 8)
    out = rms_contrast(torch.stack([half, grey_ramp]))
    assert out[0].item() == pytest.approx(0.2, abs=1e-6)
    assert out[1].item() == pytest.approx(torch.linspace(0, 1, 8).std(unbiased=False).item(), abs=1e-6)


def test_applies_to_overrides_content_rule():
    reward = build("toy_text_contrast", applies_to=["ocr"])
    assert reward.applies("no quotes here", {"source": "ocr"})
    assert not reward.applies('quoted "x"', {"source": "pickscore"})


def test_score_all_runs_each_reward_and_times_it():
    rewards = {n: build(n) for n in ["toy_brightness", "toy_saturation", "toy_color_match"]}
    images = torch.stack([solid([1, 0, 0]), solid([1, 1, 1])])
    scores, seconds = score_all(rewards, images, ["a", "b"], [COLOR_META, {}], max_workers=2)
    assert set(scores) == set(rewards) == set(seconds)
    assert torch.allclose(scores["toy_saturation"], torch.tensor([1.0, 0.0]))
    assert math.isnan(scores["toy_color_match"][1].item()) and scores["toy_color_match"][0] == 1.0
    assert all(s >= 0 for s in seconds.values())


def test_score_all_propagates_errors():
    with pytest.raises(ValueError, match="images must be"):
        score_all({"b": build("toy_brightness")}, torch.zeros(2, 4, 8, 8), ["a", "b"])


def test_cli_list_and_score(tmp_path, capsys):
    import json

    from PIL import Image

    from marble.rewards.cli import main

    assert main(["list"]) == 0
    assert "toy_color_match" in capsys.readouterr().out.split()
    Image.new("RGB", (8, 8), (255, 0, 0)).save(tmp_path / "red.png")
    meta = json.dumps(COLOR_META)
    assert main(["score", "--reward", "toy_color_match", "--image", str(tmp_path / "red.png"),
                 "--prompt", "a red dog", "--metadata", meta]) == 0
    line = json.loads(capsys.readouterr().out.splitlines()[0])
    assert line["score"] == pytest.approx(1.0) and line["reward"] == "toy_color_match"
    assert main(["score", "--reward", "toy_text_contrast", "--image", str(tmp_path / "red.png"),
                 "--prompt", "no quotes"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["score"] is None  # NaN -> null


def test_brightness_copy_is_brightness_under_a_second_name():
    """The claim's no-conflict control (docs/claim.md): toy_brightness_copy scores exactly as
    toy_brightness, and with `applies_to: [ocr]` only the OCR prompts (the rest NaN)."""
    images = torch.stack([solid([1, 1, 1]), solid([0.5, 0.25, 0.5]), solid([0, 0, 0])])
    meta = [{"source": "ocr"}, {"source": "pickscore"}, {"source": "ocr"}]
    copy = build("toy_brightness_copy", applies_to=["ocr"])(images, ["p"] * 3, meta)
    bright = build("toy_brightness")(images, ["p"] * 3, meta)
    assert copy[0] == bright[0] == 1.0 and copy[2] == bright[2] == 0.0
    assert torch.isnan(copy[1]) and bright[1] == pytest.approx(0.299 * 0.5 + 0.587 * 0.25 + 0.114 * 0.5)
    assert "toy_brightness_copy" in set(available())


def test_left_bright_scores_the_left_right_luma_difference_on_quoted_prompts():
    """toy_left_bright (issue 47, the claim's (b) specialist): (left luma - right luma + 1) / 2
    on prompts with a quoted span, NaN elsewhere. By hand: left white, right black: 1; mirrored:
    0; uniform grey: 0.5, whatever its level, so brightness alone cannot move it."""
    white, black = torch.ones(3, 8, 4), torch.zeros(3, 8, 4)
    left_lit, right_lit = torch.cat([white, black], dim=2), torch.cat([black, white], dim=2)
    grey = torch.full((3, 8, 8), 0.3)
    images = torch.stack([left_lit, right_lit, grey, left_lit])
    prompts = ['a sign "Hi"', 'a sign "Hi"', 'a sign "Hi"', "no quotes"]
    out = build("toy_left_bright")(images, prompts, [{}] * 4)
    assert out[:3].tolist() == pytest.approx([1.0, 0.0, 0.5]) and torch.isnan(out[3])


def test_the_control_has_four_copies_of_brightness():
    """The K-copies control (issue 47 item 6): copies 2 and 3 score as toy_brightness."""
    images = torch.stack([solid([0.5, 0.25, 0.5]), solid([1, 1, 1])])
    bright = build("toy_brightness")(images, ["p"] * 2, [{}] * 2)
    for name in ("toy_brightness_copy2", "toy_brightness_copy3"):
        assert torch.equal(build(name)(images, ["p"] * 2, [{}] * 2), bright)


def test_warmth_scores_red_over_blue_on_quoted_prompts():
    """toy_warmth (issue 47, the claim's (b) specialist): (mean R - mean B + 1) / 2 on prompts
    with a quoted span. By hand: red 1, blue 0, grey 0.5, orange (1, 0.65, 0) 1."""
    images = torch.stack([solid([1, 0, 0]), solid([0, 0, 1]), solid([0.3, 0.3, 0.3]), solid([1, 0.65, 0]),
                          solid([1, 0, 0])])
    prompts = ['a sign "Hi"'] * 4 + ["no quotes"]
    out = build("toy_warmth")(images, prompts, [{}] * 5)
    assert out[:4].tolist() == pytest.approx([1.0, 0.0, 0.5, 1.0]) and torch.isnan(out[4])
