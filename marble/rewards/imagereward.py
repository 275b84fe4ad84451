"""ImageReward v1.0 through the `image-reward` package, loaded from a local checkpoint.

`pip install image-reward --no-deps` (its dependency pins downgrade timm and break
open_clip; see docs/rewards.md); imported only when this reward is built. Scores the
(prompt_i, image_i) pairs directly, which equals the diagonal the reference takes from
its O(N^2) `inference_rank` call.
"""

from __future__ import annotations

import torch

from marble.rewards.base import Reward, ckpt_dir as resolve_ckpt_dir, require_file, to_pil

IMAGEREWARD_CKPT = "ImageReward.pt"
MED_CONFIG = "med_config.json"


class ImageRewardScorer(Reward):
    """Applies to every prompt; raw ImageReward (~ -2..+2)."""

    name = "imagereward"

    def __init__(self, ckpt: str | None = None, med_config: str | None = None, ckpt_dir: str | None = None,
                 device: str = "cpu", **kw):
        super().__init__(**kw)
        folder = resolve_ckpt_dir(ckpt_dir)
        ckpt_path = require_file(self.name, ckpt or IMAGEREWARD_CKPT, folder)
        config_path = require_file(self.name, med_config or MED_CONFIG, folder)
        try:
            import ImageReward as reward_lib
        except ImportError as err:
            raise ImportError(
                "imagereward needs the `image-reward` package: `pip install image-reward --no-deps` "
                "plus its real needs (docs/rewards.md)"
            ) from err
        self.model = reward_lib.load(str(ckpt_path), device=device, med_config=str(config_path)).eval()

    def score(self, images, prompts, metadata):
        scores = [float(self.model.score(prompt, image)) for prompt, image in zip(prompts, to_pil(images))]
        return torch.tensor(scores, dtype=torch.float32)
