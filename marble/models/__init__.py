"""SD3 models: loading (hub, local, in-memory random), the tiny SD3, LoRA, encode/decode.

Everything public is re-exported here; see docs/ARCHITECTURE.md for the contract.
"""

from marble.models import log_filters
from marble.models.encode import decode_latents, encode_prompts, latent_shape, velocity
from marble.models.loading import (
    RANDOM_MODELS,
    ModelNotFoundError,
    build_random_pipeline,
    load_pipeline,
)
from marble.models.lora import (
    OLD,
    TRAINABLE,
    adapter_state,
    adapters_disabled,
    add_lora_adapters,
    blend_adapter,
    load_adapter_state,
    load_lora_into_pipeline,
    lora_config_dict,
    save_lora_diffusers,
    trainable_lora_parameters,
    use_adapter,
)
from marble.models.tiny import build_tiny_pipeline, save_tiny_pipeline

# Two library warnings filtered (log_filters), before any of the above imports diffusers
# (each does so inside its functions, never at import).
log_filters.install()

__all__ = [
    "OLD",
    "RANDOM_MODELS",
    "TRAINABLE",
    "ModelNotFoundError",
    "adapter_state",
    "adapters_disabled",
    "add_lora_adapters",
    "blend_adapter",
    "build_random_pipeline",
    "build_tiny_pipeline",
    "decode_latents",
    "encode_prompts",
    "latent_shape",
    "load_adapter_state",
    "load_lora_into_pipeline",
    "load_pipeline",
    "lora_config_dict",
    "save_lora_diffusers",
    "save_tiny_pipeline",
    "trainable_lora_parameters",
    "use_adapter",
    "velocity",
]
