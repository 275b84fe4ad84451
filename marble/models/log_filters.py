"""Library warnings that say nothing a run can act on, each filtered at its logger once per
process (installed when marble.models is imported, before diffusers is).

- diffusers' SD3 `encode_prompt` warns on every call whose prompts exceed the T5
  `max_sequence_length` (or CLIP's 77 tokens): 67 times in one tiny training log. The
  truncation is the configured behaviour (`model.max_sequence_length`, docs/algorithm.md
  §2), and the warning's "removed text" is a list of empty strings (diffusers slices the
  T5 ids at CLIP's length). Its first occurrence is kept, reworded to say what happens.
- transformers warns that `SiglipImageProcessor` / `CLIPImageProcessor` need torchvision
  and falls back to their PIL versions, twice per process, when diffusers imports the SD3
  pipeline. The main environment has no torchvision on purpose (it must match torch
  exactly; Makefile: the clip environment), and the SD3 pipeline uses those processors
  only for IP-adapter images, which marble never passes. Dropped.
- diffusers' `load_lora_weights` warns twice per evaluation ("No LoRA keys associated to
  CLIPTextModelWithProjection ...", text_encoder and text_encoder_2) for a LoRA with no
  text-encoder keys, which marble's never have (its adapters sit on the transformer). The
  message comes only from diffusers' text-encoder loader (lora_base), and
  marble.models.lora counts the layers a LoRA loaded into the transformer itself. Dropped.
"""

from __future__ import annotations

import logging

TRUNCATION = "The following part of your input was truncated because"
TORCHVISION_FALLBACK = "requires torchvision (not installed); falling back to"
SD3_LOGGER = "diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3"
IMPORT_LOGGER = "transformers.utils.import_utils"
NO_TEXT_ENCODER_LORA = "No LoRA keys associated to"
LORA_TEXT_ENCODER_LOGGER = "diffusers.loaders.lora_base"


class FirstTruncationOnly(logging.Filter):
    """Lets the first truncation warning through, reworded; drops every later one."""

    def __init__(self):
        super().__init__()
        self.seen = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(TRUNCATION):
            return True
        self.seen += 1
        if self.seen > 1:
            return False
        record.msg = ("prompts longer than the text encoders' token limits are truncated "
                      "(T5: model.max_sequence_length; CLIP: 77 tokens), as configured; "
                      "said once per process")
        record.args = ()
        return True


class DropTorchvisionFallback(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return TORCHVISION_FALLBACK not in str(record.msg)


class DropNoTextEncoderLora(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(NO_TEXT_ENCODER_LORA)


def install() -> None:
    """Attach the filters (idempotent: a second call adds nothing)."""
    for name, kind in ((SD3_LOGGER, FirstTruncationOnly), (IMPORT_LOGGER, DropTorchvisionFallback),
                       (LORA_TEXT_ENCODER_LOGGER, DropNoTextEncoderLora)):
        logger = logging.getLogger(name)
        if not any(isinstance(f, kind) for f in logger.filters):
            logger.addFilter(kind())
