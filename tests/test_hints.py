"""Install hints run as written: every `pip install` an error message or doctor row prints
names this project's own install (`-e ".[extra]"`, an extra pyproject.toml defines, a
constraints file that exists), never the unrelated PyPI package `marble`; one runs for real
through pip's resolver (`--dry-run`, offline); the paddle pin is one the code accepts."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HINT = re.compile(r"pip install [^`\n]*")
# Files a hint may name that the user writes (docs/cluster.md, step 2), not the repository.
USER_FILES = {"site-torch.txt"}


def _hints() -> list[tuple[str, str]]:
    out = []
    for path in sorted((ROOT / "marble").rglob("*.py")):
        text = path.read_text(encoding="utf-8").replace('\\"', '"').replace('"\n', "").replace(
            '  "', "")
        out += [(str(path.relative_to(ROOT)), m.group(0)) for m in HINT.finditer(text)]
    return out


def test_hints_name_this_projects_install():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    hints = _hints()
    assert len(hints) >= 6
    for where, hint in hints:
        assert "marble[" not in hint, f"{where}: {hint} (PyPI's marble is another project)"
        for extra in re.findall(r'-e "\.\[([a-z,]+)\]"', hint):
            assert set(extra.split(",")) <= set(extras), f"{where}: {hint}"
        for constraint in re.findall(r"-c ([\w./-]+)", hint):
            assert constraint in USER_FILES or (ROOT / constraint).is_file(), f"{where}: {hint}"


def test_an_extra_hint_resolves_through_pip():
    """As printed (`pip install -c workflow/envs/constraints.txt -e ".[ocr]"`), pip's dry run
    offline: the extra exists and the constraints file parses."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-build-isolation",
         "--no-index", "-c", "workflow/envs/constraints.txt", "-e", ".[ocr]"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0 and "Would install marble" in proc.stdout, proc.stderr[-2000:]


def test_the_paddle_extra_installs_a_version_the_code_accepts():
    from marble.rewards.ocr import require_paddleocr_2

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pin = next(req for req in extras["paddle"] if req.startswith("paddleocr"))
    assert pin == "paddleocr>=2.9.1,<3"
    require_paddleocr_2("2.9.1")  # the extra's lowest version passes
    with pytest.raises(ImportError, match=r'-e "\.\[paddle\]"'):
        require_paddleocr_2("3.7.0")


def test_the_prepare_hint_runs_as_a_dry_run(tmp_path):
    """The doctor's fix for missing downloads, with the profile and the same config files,
    is a command Snakemake accepts (`-n`)."""
    from marble import doctor

    config = doctor.load_workflow_config(["config/paper.yaml"], ROOT)
    config["model_dir"] = str(tmp_path / "absent")  # nothing downloaded
    row = next(r for r in doctor.asset_rows(config, ROOT, configfiles=("config/paper.yaml",))
               if r.name == "model files")
    command = row.fix.split(" (", 1)[0].split()
    assert command[:4] == ["snakemake", "--profile", "slurm", "prepare"], row.fix
    proc = subprocess.run([str(Path(sys.executable).parent / "snakemake"), "-n", *command[1:]],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
