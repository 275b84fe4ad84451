"""Pin the torch this environment already has, however it came (docs/cluster.md, step 2).

    python workflow/envs/site_torch.py > site-torch.txt
    pip install -c site-torch.txt -c workflow/envs/constraints.txt -e '.[workflow,ocr,clip]'

Writes one pip constraint per installed package of the torch family (torch, torchvision,
torchaudio, triton), exactly as pip would reinstall it: `torch @ file:///...whl` for a wheel
file, `torch @ <url>` for a direct URL, `torch==2.14.1+cu128` for an index install (a site
module or a conda environment with pip metadata reads the same). `pip freeze | grep ==` misses
the first two, and a constraint that matches nothing lets pip replace the site's CUDA build
with PyPI's newest torch. Exits 2, naming the fix, when torch imports but pip cannot see it
(no dist-info: a module on PYTHONPATH, a venv without --system-site-packages): pip would then
install a second torch beside it. Standard library only: it must run before anything else is
installed.
"""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import json
import sys

FAMILY = ("torch", "torchvision", "torchaudio", "triton")


def constraint(dist: metadata.Distribution) -> str:
    """The requirement line that reinstalls exactly this distribution."""
    name = dist.metadata["Name"]
    direct = dist.read_text("direct_url.json")
    if direct:
        info = json.loads(direct)
        if "url" in info and "vcs_info" not in info and not info.get("dir_info", {}).get("editable"):
            return f"{name} @ {info['url']}"
    return f"{name}=={dist.version}"


def main() -> int:
    lines = []
    for name in FAMILY:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            if name == "torch" and importlib.util.find_spec("torch") is not None:
                origin = importlib.util.find_spec("torch").origin
                print(f"site_torch: torch imports from {origin} but pip cannot see it (no "
                      "dist-info): recreate the venv with --system-site-packages, or install "
                      "the site's wheel into it", file=sys.stderr)
                return 2
            continue
        lines.append(constraint(dist))
    if not lines:
        print("site_torch: no torch here: install the site's torch first (module, wheel or "
              "PyTorch index; docs/cluster.md)", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
