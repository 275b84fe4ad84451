"""marble: MARBLE multi-reward balancing on DiffusionNFT for Stable Diffusion 3.5."""

__version__ = "0.1.0"
