"""The install commands marble prints in its errors and doctor rows, from one place.

Every one keeps the site's torch: `-c site-torch.txt` (docs/cluster.md, step 2:
`python workflow/envs/site_torch.py > site-torch.txt` pins torch as installed, e.g.
`torch==2.14.1+cu128`) comes first, then the project's tested pins. Without it pip may
replace a site's CUDA build with PyPI's newest torch while installing an extra. On a laptop or
CI machine the same file pins the CPU torch that is there. tests/test_hints.py collects every
`pip install` in marble/ and fails on one without the constraint.
"""

from __future__ import annotations

import re

SITE_TORCH = "-c site-torch.txt"
CONSTRAINTS = f"{SITE_TORCH} -c workflow/envs/constraints.txt"
PADDLE_GPU_INDEX = "https://www.paddlepaddle.org.cn/packages/stable/cu126/"


def extra(names: str) -> str:
    """`pip install` of marble's own extras (in the repository), keeping the site's torch."""
    return f'pip install {CONSTRAINTS} -e ".[{names}]"'


def paddle_gpu() -> str:
    """PaddleOCR on the GPU (the paper's engine): paddlepaddle-gpu from Paddle's index of the
    site's CUDA (cu118 / cu126 / cu129), paddleocr 2.x (workflow/envs/paddleocr-gpu.txt)."""
    return f"pip install {CONSTRAINTS} -r workflow/envs/paddleocr-gpu.txt --extra-index-url {PADDLE_GPU_INDEX}"


def torchvision(torch_version: str) -> str:
    """The torchvision built for this torch: its minor release (torchvision 0.(m+15) pairs with
    torch 2.m) from the index of the torch's own build (`+cu128` -> PyTorch's cu128 index; no
    local tag: PyPI's default build). PyPI's torchvision against a site's CUDA torch fails at
    import (`torchvision::nms does not exist`)."""
    match = re.match(r"2\.(\d+)\.\d+(?:\+(\w+))?", torch_version)
    if not match:
        return f"pip install {SITE_TORCH} torchvision  # the release built for torch {torch_version}"
    minor, local = int(match.group(1)), match.group(2)
    index = f" --index-url https://download.pytorch.org/whl/{local}" if local else ""
    return f'pip install {SITE_TORCH} "torchvision==0.{minor + 15}.*"{index}'
