"""The batch geometry of one optimizer step: global prompts and images, against the preset's.

The reference's paper runs use 2 nodes x 8 GPUs x 9 images x 8 batches = 1152 images (48
prompts x k = 24) per step. The same preset on one 8-GPU node halves that silently unless
num_batches_per_epoch doubles; the trainer prints the geometry and refuses a step that
differs from the preset's `train.reference_images_per_step` unless
`train.allow_geometry_change` says the change is meant.
"""

from __future__ import annotations

from marble.config import ConfigError


def step_geometry(world_size: int, batch_size: int, num_batches: int, k: int) -> tuple[int, int]:
    """(distinct prompts, images) per optimizer step, over all ranks."""
    images = world_size * batch_size * num_batches
    return images // k, images


def check_geometry(world_size: int, sampling, train) -> str:
    """A one-line description of the step; ConfigError when it differs from the reference
    geometry and no explicit `train.allow_geometry_change`; the line says so when allowed."""
    prompts, images = step_geometry(world_size, sampling.batch_size, sampling.num_batches_per_epoch,
                                    sampling.images_per_prompt)
    line = (f"batch geometry: {prompts} prompts x {sampling.images_per_prompt} = {images} images per step "
            f"({world_size} ranks x {sampling.batch_size} x {sampling.num_batches_per_epoch} batches)")
    want = train.reference_images_per_step
    if want is None or want == images:
        return line
    batches = want / (world_size * sampling.batch_size)  # what keeps `want` with these ranks
    keep = (f"set sampling.num_batches_per_epoch={batches:g}" if batches.is_integer()
            else f"no whole num_batches_per_epoch gives it with batch_size {sampling.batch_size}")
    hint = (f"the preset's reference is {want} images per step ({want // sampling.images_per_prompt} prompts); "
            f"with {world_size} ranks {keep}, or train.allow_geometry_change=true to run it as is")
    if not train.allow_geometry_change:
        raise ConfigError(f"{line}: {hint}")
    return f"{line}; WARNING: {hint}"
