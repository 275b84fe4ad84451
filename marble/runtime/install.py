"""The install commands marble prints in its errors and doctor rows, from one place.

Every one keeps the site's torch: `-c site-torch.txt` (docs/cluster.md, step 2:
`python workflow/envs/site_torch.py > site-torch.txt` pins torch as installed, e.g.
`torch==2.14.1+cu128`) comes first, then the project's tested pins. Without it pip may
replace a site's CUDA build with PyPI's newest torch while installing an extra. On a laptop or
CI machine the same file pins the CPU torch that is there. tests/test_hints.py collects every
`pip install` in marble/ and fails on one without the constraint.

torchvision must be the build of the installed torch (PyPI's beside a site's CUDA or CPU torch
fails at import: `operator torchvision::nms does not exist`). The extras that need it (clip,
geneval) therefore print, while torchvision is absent, an install that takes it from where
torch came from: PyTorch's index of the torch's build tag (`+cpu`, `+cu128`, ...), the site's
own wheels for any other tag (`+site`, `+computecanada`: no PyTorch index has them), PyPI only
for PyPI's torch (no tag). tests/test_hints.py dry-runs every hint beside a wheel torch.
"""

from __future__ import annotations

import importlib.metadata as metadata
import re

SITE_TORCH = "-c site-torch.txt"
CONSTRAINTS = f"{SITE_TORCH} -c workflow/envs/constraints.txt"
PADDLE_GPU_INDEX = "https://www.paddlepaddle.org.cn/packages/stable/cu126/"


PYTORCH_INDEX = "https://download.pytorch.org/whl/"
# The build tags PyTorch's own index serves (its folder names); any other local tag is a site's.
PYTORCH_TAG = re.compile(r"cpu|cu\d+|rocm\d+(\.\d+)*|xpu")
# The extras whose requirements name torchvision (pyproject.toml; tests/test_hints.py checks).
TORCHVISION_EXTRAS = frozenset({"clip", "geneval"})
SITE_WHEELS = "SITE_WHEELS"  # the placeholder a site's-tag hint asks the user to replace


def installed(name: str) -> str | None:
    """The installed version of `name` (pip's metadata, no import), None when absent."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def extra(names: str, torch: str | None = "installed", torchvision: str | None = "installed") -> str:
    """`pip install` of marble's own extras (in the repository), keeping the site's torch and
    its torchvision pair. `torch` / `torchvision`: the installed versions (read here unless
    given; None: absent)."""
    torch = installed("torch") if torch == "installed" else torch
    torchvision = installed("torchvision") if torchvision == "installed" else torchvision
    plain = f'pip install {CONSTRAINTS} -e ".[{names}]"'
    if torchvision or not torch or not TORCHVISION_EXTRAS.intersection(names.split(",")):
        return plain  # nothing to pair (or torchvision is there, and pip keeps it)
    release, tag = _release(torch)
    if release is None or (tag and not PYTORCH_TAG.fullmatch(tag)):
        # No index serves a site's build: torchvision first, from the site, then the extra
        # (the note last: a shell comment ends the line).
        command, note = _torchvision_parts(torch)
        return f"{command} && {plain}{note}"
    # One resolve: the extra's torchvision requirement met by the torch's own build. A local
    # tag sorts above the public release, so `+cpu` wins over PyPI's 0.28.0 of the same minor.
    index = f" --extra-index-url {PYTORCH_INDEX}{tag}" if tag else ""
    return f'{plain} "torchvision=={release}"{index}'


def paddle_gpu() -> str:
    """PaddleOCR on the GPU (the paper's engine): paddlepaddle-gpu from Paddle's index of the
    site's CUDA (cu118 / cu126 / cu129), paddleocr 2.x (workflow/envs/paddleocr-gpu.txt)."""
    return f"pip install {CONSTRAINTS} -r workflow/envs/paddleocr-gpu.txt --extra-index-url {PADDLE_GPU_INDEX}"


def _release(torch_version: str) -> tuple[str | None, str | None]:
    """(the torchvision release that pairs with this torch, as `0.N.*`, its local tag):
    torchvision 0.(m+15) pairs with torch 2.m."""
    match = re.match(r"2\.(\d+)\.\d+(?:\+([\w.]+))?", torch_version)
    if not match:
        return None, None
    return f"0.{int(match.group(1)) + 15}.*", match.group(2)


def _torchvision_parts(torch_version: str) -> tuple[str, str]:
    """(the command, a trailing note or "") of torchvision()."""
    release, tag = _release(torch_version)
    note = (f"  # {SITE_WHEELS}: where the site's torch {torch_version} came from (its wheelhouse or "
            "module); PyPI's torchvision does not fit it")
    if release is None:
        return f"pip install {SITE_TORCH} --no-index --find-links {SITE_WHEELS} torchvision", note
    spec = f'{SITE_TORCH} --force-reinstall --no-deps "torchvision=={release}"'
    if not tag:
        return f"pip install {spec}", ""
    if PYTORCH_TAG.fullmatch(tag):
        return f"pip install {spec} --index-url {PYTORCH_INDEX}{tag}", ""
    return f"pip install {spec} --no-index --find-links {SITE_WHEELS}", note


def torchvision(torch_version: str) -> str:
    """The torchvision built for this torch, replacing a mismatched one (--force-reinstall
    --no-deps: torch stays): PyTorch's index of the torch's build tag (`+cu128` -> .../whl/cu128),
    PyPI's for a torch without a tag, and the site's own wheels for a site's tag (`+site`,
    `+computecanada`: never turned into a PyTorch index URL, which does not exist)."""
    return "".join(_torchvision_parts(torch_version))


