"""CLIPScore's input tensor as the reference builds it: float image, bilinear antialiased
resize, centre crop, normalise (checked against weights computed by hand)."""

from __future__ import annotations

import torch

from marble.rewards.clip_family import clip_pixel_values

# Antialiased bilinear at scale 2: a triangle of radius 2 input pixels around each output
# centre (2i + 0.5), weights 1 - |d|/2 at distances 0.5 and 1.5 (3/4, 1/4), renormalised
# where the border cuts the support.
ROWS_4_TO_2 = torch.tensor([[3, 3, 1, 0], [0, 1, 3, 3]]) / 7
COLS_6_TO_3 = torch.tensor([[3 / 7, 3 / 7, 1 / 7, 0, 0, 0],
                            [0, 1 / 8, 3 / 8, 3 / 8, 1 / 8, 0],
                            [0, 0, 0, 1 / 7, 3 / 7, 3 / 7]])
MEAN, STD = [0.5, 0.4, 0.3], [0.2, 0.25, 0.5]
CONFIG = {"do_resize": True, "size": {"shortest_edge": 2}, "do_center_crop": True,
          "crop_size": {"height": 2, "width": 2}, "do_normalize": True, "image_mean": MEAN, "image_std": STD}


def test_pixel_values_match_the_hand_computed_tensor():
    g = torch.Generator().manual_seed(0)
    images = torch.rand(2, 3, 4, 6, generator=g)
    resized = torch.einsum("ih,nchw,jw->ncij", ROWS_4_TO_2, images, COLS_6_TO_3)  # 4x6 -> 2x3
    cropped = resized[..., :, 0:2]  # centre crop 3 -> 2: left = round(0.5) = 0
    expected = (cropped - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    got = clip_pixel_values(images, CONFIG)
    assert got.shape == (2, 3, 2, 2) and got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_float_input_is_not_quantised_to_8_bits():
    """A change below one 8-bit level still reaches the model input (the PIL path drops it)."""
    images = torch.full((1, 3, 4, 6), 0.5)
    nudged = images + 0.001  # < 1/255
    config = {**CONFIG, "do_normalize": False}
    assert (clip_pixel_values(nudged, config) - clip_pixel_values(images, config)).abs().min() > 0.0009
