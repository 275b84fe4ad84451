"""CLIP-family scorers end to end on a tiny random-init CLIP saved to disk and loaded back."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from rewards_tiny_clip import save_tiny_clip

from marble.rewards import build
from marble.rewards import geneval_rules as R

PROMPTS = ["a cat", 'a sign that says "hi"', "a very long prompt " * 20]


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory):
    return save_tiny_clip(tmp_path_factory.mktemp("clip") / "tiny-clip")


@pytest.fixture(scope="module")
def images():
    torch.manual_seed(0)
    return torch.rand(3, 3, 40, 48)


def test_clipscore_is_a_cosine_and_pickscore_rescales_it(tiny_clip, images):
    clip = build("clipscore", model=str(tiny_clip), batch_size=2)
    pick = build("pickscore", model=str(tiny_clip))
    c, p = clip(images, PROMPTS), pick(images, PROMPTS)
    assert c.shape == p.shape == (3,) and c.dtype == p.dtype == torch.float32
    assert torch.isfinite(c).all() and (c.abs() <= 1 + 1e-5).all()
    # pickscore = logit_scale.exp() * cos / 26 on the same model (its own, PIL preprocessing;
    # clipscore preprocesses the float image as the reference's ClipScorer)
    scale = pick.model.logit_scale.exp().item()
    with torch.no_grad():
        cos = (pick.image_embeds(images) * pick.text_embeds(PROMPTS)).sum(-1)
    assert torch.allclose(p, cos * scale / 26, atol=1e-5)
    # chunking does not change scores
    assert torch.allclose(build("clipscore", model=str(tiny_clip), batch_size=3)(images, PROMPTS), c, atol=1e-5)


def test_clipscore_matches_a_hand_computed_cosine(tiny_clip, images):
    from transformers import CLIPModel, CLIPProcessor

    from marble.rewards.clip_family import clip_pixel_values

    model, proc = CLIPModel.from_pretrained(tiny_clip), CLIPProcessor.from_pretrained(tiny_clip)
    with torch.no_grad():
        pix = clip_pixel_values(images[:1], proc.image_processor.to_dict())
        ids = proc(text=PROMPTS[:1], return_tensors="pt", padding=True)
        img = model.visual_projection(model.vision_model(pixel_values=pix).pooler_output)
        txt = model.text_projection(model.text_model(**ids).pooler_output)
    expected = torch.nn.functional.cosine_similarity(img, txt).item()
    assert build("clipscore", model=str(tiny_clip))(images[:1], PROMPTS[:1]).item() == pytest.approx(expected, abs=1e-5)


def test_override_gives_nan_for_other_sources(tiny_clip, images):
    clip = build("clipscore", model=str(tiny_clip), applies_to=["pickscore"])
    out = clip(images, PROMPTS, [{"source": "pickscore"}, {"source": "ocr"}, {"source": "pickscore"}])
    assert math.isnan(out[1].item()) and torch.isfinite(out[[0, 2]]).all()
    assert clip.failures == 0


def test_aesthetic_head_from_pth(tiny_clip, images, tmp_path):
    from marble.rewards.clip_family import AestheticMLP

    torch.manual_seed(1)
    head = AestheticMLP(16)
    torch.save(head.state_dict(), tmp_path / "sac+logos+ava1-l14-linearMSE.pth")
    reward = build("aesthetic", model=str(tiny_clip), ckpt_dir=str(tmp_path))
    out = reward(images, PROMPTS)
    with torch.no_grad():
        expected = head.eval()(reward.image_embeds(images)).squeeze(-1)
    assert out.shape == (3,) and torch.allclose(out, expected, atol=1e-6)
    with pytest.raises(FileNotFoundError, match="marble download rewards --out"):
        build("aesthetic", model=str(tiny_clip), ckpt_dir=str(tmp_path / "missing"))
    torch.save(AestheticMLP(8).state_dict(), tmp_path / "wrong.pth")
    with pytest.raises(ValueError, match="8-d embeddings, CLIP gives 16"):
        build("aesthetic", model=str(tiny_clip), head=str(tmp_path / "wrong.pth"))


class BoxDetector:
    """A stand-in detector: the same two dogs in every image (the left one red, masked)."""

    def detect(self, images):
        h, w = images[0].shape[:2]
        mask = np.zeros((2, h, w), dtype=bool)
        mask[0, :, : w // 2] = True
        mask[1, :, w // 2 :] = True
        boxes = np.array([[0, 0, w // 2, h], [w // 2, 0, w, h]], dtype=float)
        return [{"dog": R.ClassDetections(boxes, np.array([0.95, 0.5]), mask)} for _ in images]


def test_geneval_reward_with_clip_colours(tiny_clip, images):
    from marble.rewards.geneval import ClipColorClassifier

    classifier = ClipColorClassifier(str(tiny_clip))
    reward = build("geneval", detector=BoxDetector(), color_classifier=classifier)
    metas = [{"tag": "counting", "include": [{"class": "dog", "count": 1}]},
             {"tag": "two_object", "include": [{"class": "dog", "count": 2}]},
             {"source": "pickscore"}]
    out = reward(images, PROMPTS, metas)
    # counting: 0.9 threshold keeps one dog -> 1; two_object: both kept -> 1; no include -> NaN
    assert out[:2].tolist() == [1.0, 1.0] and math.isnan(out[2].item())
    colors = classifier((images[0].permute(1, 2, 0) * 255).byte().numpy(),
                        R.select_objects(BoxDetector().detect([np.zeros((40, 48, 3))])[0], "x")["dog"], "dog")
    assert len(colors) == 2 and set(colors) <= set(R.COLORS)
    color_meta = {"tag": "colors", "include": [{"class": "dog", "count": 2, "color": colors[0]}]}
    detail = reward.evaluate_detail(images[:1], [color_meta])[0]
    assert detail["tag"] == "colors" and set(detail) >= {"score", "accuracy", "strict_accuracy"}
    n_match = colors.count(colors[0])  # credits: count 1, colour 1 - |2 - n_match| / 2
    assert detail["score"] == pytest.approx((1 + 1 - abs(2 - n_match) / 2) / 2)
    assert detail["strict_accuracy"] == float(n_match == 2)


def test_geneval_without_mmdet_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="mask2former.*marble download rewards"):
        build("geneval", ckpt_dir=str(tmp_path))
