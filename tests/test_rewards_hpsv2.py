"""HPSv2 on a tiny open_clip architecture built from a config dict (skips without open_clip +
torchvision; run it in /work/venv-vision, see docs/rewards.md), and the error paths."""

from __future__ import annotations

import json

import pytest
import torch

from marble.rewards import build

TINY = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "head_width": 16, "patch_size": 8},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}


@pytest.fixture(scope="module")
def tiny_hps(tmp_path_factory):
    open_clip = pytest.importorskip("open_clip")
    folder = tmp_path_factory.mktemp("hps")
    config = folder / "marble-tiny-hps.json"
    config.write_text(json.dumps(TINY))
    open_clip.add_model_config(config)
    torch.manual_seed(0)
    model = open_clip.create_model("marble-tiny-hps")
    torch.save({"state_dict": model.state_dict()}, folder / "HPS_v2.1_compressed.pt")
    return folder, config, model.eval()


def test_hpsv2_scores_are_cosines(tiny_hps):
    import open_clip

    folder, config, model = tiny_hps
    reward = build("hpsv2", arch="marble-tiny-hps", model_config=str(config), ckpt_dir=str(folder), batch_size=2)
    torch.manual_seed(1)
    images = torch.rand(3, 3, 48, 40)
    prompts = ["a cat", "a dog on a sofa", "x"]
    out = reward(images, prompts)
    assert out.shape == (3,) and out.dtype == torch.float32 and (out.abs() <= 1 + 1e-5).all()
    from marble.rewards.hpsv2 import clip_preprocess

    with torch.no_grad():
        img = torch.nn.functional.normalize(model.encode_image(clip_preprocess(images, 32)), dim=-1)
        tokens = open_clip.get_tokenizer("marble-tiny-hps")(prompts)
        txt = torch.nn.functional.normalize(model.encode_text(tokens), dim=-1)
    assert torch.allclose(out, (img * txt).sum(-1), atol=1e-5)


def test_hpsv2_missing_checkpoint_names_the_download(tmp_path):
    with pytest.raises(FileNotFoundError, match="HPS_v2.1_compressed.pt is missing.*marble download rewards"):
        build("hpsv2", ckpt_dir=str(tmp_path))


def test_clip_preprocess_resizes_the_long_side_and_pads():
    """HPSv2's ResizeMaxSize: 64x96 -> 21x32 (round(64/3)), padded 5 above and 6 below with 0."""
    from marble.rewards.hpsv2 import CLIP_MEAN, CLIP_STD, clip_preprocess

    x = torch.ones(2, 3, 64, 96)
    y = clip_preprocess(x, 32)
    assert y.shape == (2, 3, 32, 32)
    one, zero = (1 - CLIP_MEAN[0]) / CLIP_STD[0], (0 - CLIP_MEAN[0]) / CLIP_STD[0]
    assert torch.allclose(y[0, 0, 5:26], torch.full((21, 32), one), atol=1e-4)
    assert torch.allclose(y[0, 0, :5], torch.full((5, 32), zero))
    assert torch.allclose(y[0, 0, 26:], torch.full((6, 32), zero))


def test_clip_preprocess_keeps_bicubic_overshoot():
    """torchvision does not clamp float images after a bicubic resize; neither does the reference."""
    from marble.rewards.hpsv2 import CLIP_MEAN, CLIP_STD, clip_preprocess

    step = torch.zeros(1, 3, 64, 64)
    step[..., 32:] = 1.0
    y = clip_preprocess(step, 24) * torch.tensor(CLIP_STD).view(1, 3, 1, 1) + torch.tensor(CLIP_MEAN).view(1, 3, 1, 1)
    assert y.max() > 1.0 + 1e-3 and y.min() < -1e-3
