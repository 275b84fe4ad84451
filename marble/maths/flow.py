"""The rectified-flow forward process of SD3 (docs/algorithm.md §4), defined once.

    x_t = (1 - sigma) x0 + sigma eps        sigma = 0: the clean latent, 1: pure noise

Training (`marble.training.microstep`), `marble bench` and the tiny model's pretraining
(`marble.models.pretrain`) all noise latents with `forward_process`.
"""

from __future__ import annotations

import torch

__all__ = ["forward_process"]


def forward_process(x0: torch.Tensor, eps: torch.Tensor, sigma: torch.Tensor | float) -> torch.Tensor:
    """x_t = (1 - sigma) x0 + sigma eps; `sigma` a scalar or one value per sample ([B])."""
    sigma = torch.as_tensor(sigma, device=x0.device)
    sb = sigma.reshape(-1, *([1] * (x0.dim() - 1))) if sigma.dim() else sigma
    sb = sb.to(x0.dtype)
    return (1.0 - sb) * x0 + sb * eps
