"""The install recipe keeps the site's torch (workflow/envs/site_torch.py): over a torch
installed from a wheel file (a tiny fake one built here, then deleted), its constraint file (a
version pin with the local tag) stops an eager upgrade from replacing it, where the same install
without it does replace torch."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A minimal pure-Python wheel: one module and its dist-info."""
    tag = f"{name}-{version}"
    files = {f"{name}/__init__.py": f"__version__ = {version!r}\n",
             f"{tag}.dist-info/METADATA": "Metadata-Version: 2.1\n"
             f"Name: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires),
             f"{tag}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
             "Tag: py3-none-any\n"}
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    files[f"{tag}.dist-info/RECORD"] = "\n".join([*record, f"{tag}.dist-info/RECORD,,"]) + "\n"
    out = folder / f"{tag}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return out


def _isolated() -> dict:
    """This machine's pip settings (find-links, constraints) left out: only the test's wheels."""
    out = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return {**out, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_CACHE_DIR": "1"}


def _run(cmd: list, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300,
                          check=False, env=env or _isolated())


def _torch_version(python: Path) -> str:
    return _run([python, "-c", "import torch; print(torch.__version__)"]).stdout.strip()


def test_the_recipe_keeps_a_torch_installed_from_a_wheel_file(tmp_path):
    site, index = tmp_path / "site", tmp_path / "index"
    site.mkdir()
    index.mkdir()
    site_wheel = _wheel(site, "torch", "2.14.1+site")  # the site's build, from a file
    _wheel(index, "torch", "9.0.0")  # PyPI's newest, which must not replace it
    _wheel(index, "needs_torch", "1.0", requires=("torch",))
    venv = tmp_path / "venv"
    # No pip inside (ensurepip costs ~10 s): this pip installs into it (`pip --python`).
    assert _run([sys.executable, "-m", "venv", "--without-pip", venv]).returncode == 0
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-index",
           "--disable-pip-version-check"]
    assert _run([*pip, site_wheel]).returncode == 0
    pins = _run([python, ROOT / "workflow/envs/site_torch.py"])
    assert pins.returncode == 0, pins.stderr
    # The installed version with its local tag, not the wheel's path (which breaks once the file is gone).
    assert pins.stdout.strip() == "torch==2.14.1+site"
    (tmp_path / "site-torch.txt").write_text(pins.stdout)
    site_wheel.unlink()  # the site's wheel deleted after the install: the pin still holds
    eager = [*pip, "--find-links", index, "--upgrade", "--upgrade-strategy", "eager", "needs_torch"]
    kept = _run([*eager, "-c", tmp_path / "site-torch.txt"])
    assert kept.returncode == 0, kept.stderr
    assert _torch_version(python) == "2.14.1+site"
    # A later extra's install (the recipe's step 3 shape) resolves beside it too.
    again = _run([*pip, "--find-links", index, "-c", tmp_path / "site-torch.txt", "--force-reinstall",
                  "--no-deps", "needs_torch"])
    assert again.returncode == 0 and _torch_version(python) == "2.14.1+site", again.stderr
    # The control: the same install without the constraint replaces the site's torch.
    assert _run(eager).returncode == 0
    assert _torch_version(python) == "9.0.0"


def test_a_torch_pip_cannot_see_is_refused(tmp_path):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("__version__ = '2.14.1'\n")
    proc = _run([sys.executable, "-S", ROOT / "workflow/envs/site_torch.py"],
                env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2 and "pip cannot see it" in proc.stderr, proc.stdout + proc.stderr


def test_the_conda_env_holds_every_stack_of_the_paper_path():
    """`--sdm conda` builds workflow/envs/marble.yaml: the workflow, both OCR engines and
    HPSv2's open_clip (GenEval's mmcv-full is compiled in it, workflow/envs/geneval.txt)."""
    import re
    import tomllib

    import yaml

    env = yaml.safe_load((ROOT / "workflow/envs/marble.yaml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    extras = set(re.search(r"\[([a-z,]+)\]", next(p for p in pip if p.startswith("-e"))).group(1)
                 .split(","))
    assert {"workflow", "ocr", "paddle", "clip"} <= extras
    defined = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras <= set(defined)
