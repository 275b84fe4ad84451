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


INSTALL_CALL = re.compile(r"install\.(extra\(['\"]([a-z,]+)['\"]\)|paddle_gpu\(\)|torchvision\()")


def _hints() -> list[tuple[str, str]]:
    """Every `pip install` marble prints: the literal ones in its source, and those built by
    marble.runtime.install where a module calls it (rendered as printed)."""
    from marble.runtime import install

    out = []
    for path in sorted((ROOT / "marble").rglob("*.py")):
        where = str(path.relative_to(ROOT))
        raw = path.read_text(encoding="utf-8")
        text = raw.replace('\\"', '"').replace('"\n', "").replace('  "', "")
        if path.name != "install.py" or path.parent.name != "runtime":  # its f-string templates
            out += [(where, m.group(0)) for m in HINT.finditer(text)]
        for call in INSTALL_CALL.finditer(raw):
            if call.group(2):
                out.append((where, install.extra(call.group(2))))
            elif call.group(1) == "paddle_gpu()":
                out.append((where, install.paddle_gpu()))
            else:
                out += [(where, install.torchvision(v)) for v in ("2.14.1+cu128", "2.13.0+cpu", "2.14.1")]
    return out


def test_hints_name_this_projects_install():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    hints = _hints()
    assert len(hints) >= 12
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


def test_every_hint_keeps_the_sites_torch():
    """A hint without `-c site-torch.txt` let pip move the site's torch (the GenEval hint resolved
    torch 2.15 + CUDA wheels, the torchvision one 2.14.1). Only a `--no-deps` install of wheel
    files cannot touch torch."""
    hints = _hints()
    where = {w for w, _ in hints}
    for module in ("marble/rewards/ocr.py", "marble/rewards/geneval.py", "marble/rewards/hpsv2.py",
                   "marble/doctor.py", "marble/balancers/gramian.py"):
        assert module in where, f"no hint collected from {module}"
    bare = [(w, h) for w, h in hints if "-c site-torch.txt" not in h and "--no-deps" not in h]
    assert not bare, bare


def test_the_torchvision_hint_takes_the_release_and_index_of_the_torch_build():
    from marble.runtime import install

    assert install.torchvision("2.14.1+cu128") == \
        'pip install -c site-torch.txt "torchvision==0.29.*" --index-url https://download.pytorch.org/whl/cu128'
    assert install.torchvision("2.13.0+cpu").endswith('"torchvision==0.28.*" --index-url '
                                                     "https://download.pytorch.org/whl/cpu")
    assert install.torchvision("2.14.1") == 'pip install -c site-torch.txt "torchvision==0.29.*"'


def test_each_extra_hint_runs_as_printed_through_pips_resolver(tmp_path):
    """Every `-e ".[extra]"` hint, as printed, through pip's dry run (offline, --no-deps): the
    constraint files exist and parse (site-torch.txt: this venv's, written by the recipe's
    step 2), the extras exist."""
    import shlex

    site = tmp_path / "site-torch.txt"
    pins = subprocess.run([sys.executable, str(ROOT / "workflow/envs/site_torch.py")], capture_output=True,
                          text=True, timeout=60, check=True).stdout
    assert re.fullmatch(r"(\S+==\S+\n?)+", pins), pins  # version pins, no file paths
    site.write_text(pins)
    extras = sorted({h for _, h in _hints() if ' -e ".[' in h})
    assert len(extras) >= 5, extras
    for hint in extras:
        argv = [str(site) if a == "site-torch.txt" else a for a in shlex.split(hint)][2:]
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps",
                               "--no-build-isolation", "--no-index", *argv],
                              cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0 and "Would install marble" in proc.stdout, (hint, proc.stderr[-1500:])
