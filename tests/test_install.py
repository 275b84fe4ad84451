"""The install recipe (workflow/envs/, docs/cluster.md) cannot rot: every pin satisfies
pyproject.toml, the Makefile (what CI installs) uses the same files, and the environment
this test runs in was installed from them."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
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
    # The pin is constraints-cpu.txt's (read by the Makefile); without nvidia-smi the +cpu build.
    assert "TORCH_VERSION := $(shell sed -n 's/^torch==//p' workflow/envs/constraints-cpu.txt)" in make
    assert '$(BIN)/pip install $(TORCH_INDEX) "$(TORCH)"' in make
    torch = re.findall(r"^TORCH \?= (\S+)", make, re.M)
    assert torch == ["torch==$(TORCH_VERSION)+cpu", "torch==$(TORCH_VERSION)"]
    assert "TORCH_INDEX ?= --extra-index-url https://download.pytorch.org/whl/cpu" in make
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


def test_setup_takes_the_cpu_torch_where_no_nvidia_gpu_is(tmp_path):
    """`make -n setup` without nvidia-smi on PATH installs torch==<pin>+cpu (PyTorch's CPU index or
    a local wheelhouse), with one PyPI's build (CUDA on Linux): PyPI's torch==2.13.0 pulled 15
    nvidia wheels onto CPU machines."""
    if shutil.which("make") is None:
        pytest.skip("no make here")
    pin = _pins("constraints-cpu.txt")["torch"]
    fake = tmp_path / "gpu"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
    (fake / "nvidia-smi").chmod(0o755)

    def dry(path: str) -> str:
        return subprocess.run(["make", "-n", "-B", "setup", f"VENV={tmp_path / 'venv'}"], cwd=ROOT,
                              env={"PATH": path}, capture_output=True, text=True, check=True, timeout=60).stdout

    cpu = dry("/usr/bin:/bin")
    assert f'--extra-index-url https://download.pytorch.org/whl/cpu "torch=={pin}+cpu"' in cpu, cpu
    gpu = dry(f"{fake}:/usr/bin:/bin")
    assert f'pip install  "torch=={pin}"' in gpu and "+cpu" not in gpu, gpu
