"""The install recipe (workflow/envs/, docs/cluster.md) cannot rot: every pin satisfies
pyproject.toml, the Makefile (what CI installs) uses the same files, and the environment
this test runs in was installed from them."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
ENVS = ROOT / "workflow/envs"


def _pins(name: str) -> dict[str, str]:
    pins = {}
    for line in (ENVS / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            spec = str(req.specifier)
            if spec.startswith("=="):
                pins[canonicalize_name(req.name)] = spec[2:]
    return pins


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        reqs += [Requirement(r) for r in extra]
    return reqs


def test_every_pin_satisfies_pyproject():
    pins = {**_pins("constraints.txt"), **_pins("constraints-cpu.txt")}
    assert "torch" not in _pins("constraints.txt")  # the site's build, never the shared pins
    for req in _requirements():
        version = pins.get(canonicalize_name(req.name))
        if version is not None:
            assert req.specifier.contains(version, prereleases=True), f"{req} vs pinned {version}"


def test_makefile_installs_with_the_constraints():
    make = (ROOT / "Makefile").read_text()
    assert "CONSTRAINTS ?= -c workflow/envs/constraints.txt" in make
    assert '$(BIN)/pip install $(CONSTRAINTS) -e ".[$(EXTRAS)]" "$(TORCH)"' in make
    torch = re.search(r"^TORCH \?= (\S+)", make, re.M).group(1)
    assert torch == "torch==" + _pins("constraints-cpu.txt")["torch"]
    clip = re.search(r"^CLIP_TORCH \?= (.+)$", make, re.M).group(1).split()
    assert clip == [f"{k}=={v}" for k, v in _pins("constraints-clip.txt").items()]


def test_this_environment_matches_the_pins():
    """CI installs with `make setup`: whatever of the pinned set is installed here has the
    pinned version (a drifted pin fails here, not on a cluster)."""
    wrong = []
    for name, version in _pins("constraints.txt").items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue  # an extra this environment does not have
        if installed != version:
            wrong.append(f"{name}: installed {installed}, pinned {version}")
    assert not wrong, wrong
