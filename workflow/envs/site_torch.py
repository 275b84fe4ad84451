"""Pin the torch this environment already has, however it came (docs/cluster.md, step 2).

    python workflow/envs/site_torch.py > site-torch.txt
    pip install -c site-torch.txt -c workflow/envs/constraints.txt -e '.[workflow,ocr,clip]'

Writes one pip constraint per installed package of the torch family (torch, torchvision,
torchaudio, triton): its exact installed version with the local tag (`torch==2.14.1+cu128`,
`torch==2.14.1+site`), however it came (a wheel file, a direct URL, an index, a site module or
a conda environment with pip metadata). A version, never the wheel's path: `torch @
file:///...whl` made every later pip call fail once the file was moved or deleted, while the
installed torch satisfies the version pin without pip looking for the file. `pip freeze | grep
==` misses wheel-file installs, and a constraint that matches nothing lets pip replace the
site's CUDA build with PyPI's newest torch. Exits 2, naming the fix, when torch imports but
pip cannot see it (no dist-info: a module on PYTHONPATH, a venv without
--system-site-packages): pip would then install a second torch beside it. Standard library
only: it must run before anything else is installed.
"""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import sys

FAMILY = ("torch", "torchvision", "torchaudio", "triton")


def constraint(dist: metadata.Distribution) -> str:
    """The requirement line only this distribution satisfies: its version with the local tag
    (PEP 440: `==2.14.1+cu128` matches that build alone, not PyPI's 2.14.1)."""
    return f"{dist.metadata['Name']}=={dist.version}"


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
