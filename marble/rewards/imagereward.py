"""ImageReward v1.0, loaded from local files onto marble's own BLIP (marble/rewards/blip.py).

No `image-reward` package needed (it does not import in a current install; see blip.py).
Scores the (prompt_i, image_i) pairs directly, which equals the diagonal the reference
takes from its O(N^2) `inference_rank` call: each pair's score depends on that pair only.
"""

from __future__ import annotations

from pathlib import Path

import torch

from marble.assets.hub import local_model
from marble.rewards.base import DOWNLOAD_HINT, Reward, require_file, to_pil
from marble.rewards.base import ckpt_dir as resolve_ckpt_dir
from marble.rewards.blip import load_imagereward

IMAGEREWARD_CKPT = "ImageReward.pt"
MED_CONFIG = "med_config.json"
TOKENIZER_DIR = "bert-base-uncased"  # BLIP's tokenizer: a folder next to the checkpoint, else the download


class ImageRewardScorer(Reward):
    """Applies to every prompt; raw ImageReward (~ -2..+2). Options: `ckpt`, `med_config`,
    `tokenizer` (a local BERT tokenizer folder; default `bert-base-uncased` next to the
    checkpoint, else the downloaded `hub/google-bert/bert-base-uncased`), `ckpt_dir`, `device`,
    `batch_size`."""

    name = "imagereward"

    def __init__(self, ckpt: str | None = None, med_config: str | None = None, tokenizer: str | None = None,
                 ckpt_dir: str | None = None, device: str = "cpu", batch_size: int = 16, **kw):
        super().__init__(**kw)

        folder = resolve_ckpt_dir(ckpt_dir)
        ckpt_path = require_file(self.name, ckpt or IMAGEREWARD_CKPT, folder)
        config_path = require_file(self.name, med_config or MED_CONFIG, folder)
        tokenizer_dir = Path(tokenizer or TOKENIZER_DIR)
        if not tokenizer_dir.is_absolute() and not tokenizer_dir.is_dir():
            tokenizer_dir = folder / tokenizer_dir
        if tokenizer is None and not tokenizer_dir.is_dir():
            # `marble download rewards` puts BERT under hub/<repo id>: the id maps to it.
            tokenizer_dir = Path(local_model(TOKENIZER_DIR, folder))
        if not tokenizer_dir.is_dir():
            raise FileNotFoundError(
                f"reward {self.name!r}: tokenizer folder {tokenizer_dir} is missing; download it with "
                f"`{DOWNLOAD_HINT.format(dir=folder)}`"
            )
        self.model = load_imagereward(ckpt_path, config_path, tokenizer_dir, device=device)
        self.batch_size = int(batch_size)

    def score(self, images, prompts, metadata):
        pil = to_pil(images)
        out = [self.model.score(prompts[i : i + self.batch_size], pil[i : i + self.batch_size])
               for i in range(0, len(pil), self.batch_size)]
        return torch.cat(out).to(torch.float32)
