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

    assert install.torchvision("2.14.1+cu128") == (
        'pip install -c site-torch.txt --force-reinstall --no-deps "torchvision==0.29.*" '
        "--index-url https://download.pytorch.org/whl/cu128")
    assert install.torchvision("2.13.0+cpu").endswith('"torchvision==0.28.*" --index-url '
                                                     "https://download.pytorch.org/whl/cpu")
    assert install.torchvision("2.14.1") == \
        'pip install -c site-torch.txt --force-reinstall --no-deps "torchvision==0.29.*"'


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
        argv = argv[:argv.index("-e") + 2]  # the extra; its torchvision pair is the dry-run test's below
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps",
                               "--no-build-isolation", "--no-index", *argv],
                              cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0 and "Would install marble" in proc.stdout, (hint, proc.stderr[-1500:])


# ------------------------------------------------------- the torch / torchvision pair, dry-run

WHEEL_TORCH = sorted(Path("/opt/wheels").glob("torch-2.13.0+cpu-*.whl"))


def _stub_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    from test_site_torch import _wheel

    _wheel(folder, name.replace("-", "_"), version, requires)


def _stub_version(requirement, pins: dict) -> str:
    """A version the requirement and the project's constraints accept (a stub's own)."""
    name = requirement.name.lower().replace("_", "-")
    if name in pins:
        return pins[name]
    for spec in requirement.specifier:
        if spec.operator in ("==", ">=", "~=") and "*" not in spec.version:
            return spec.version
    return "1.0"


@pytest.fixture(scope="module")
def torch_venv(tmp_path_factory):
    """One venv holding the wheel torch 2.13.0+cpu (no torchvision), a stand-in PyPI (every
    requirement a hint names as an empty wheel; PyPI's torchvision 0.28.0 / 0.29.1, built for
    PyPI's torch of their minor) and a stand-in of PyTorch's cpu index (torchvision 0.28.0+cpu)."""
    if not WHEEL_TORCH:
        pytest.skip("no /opt/wheels/torch-2.13.0+cpu wheel here")
    from test_site_torch import _isolated, _run

    base = tmp_path_factory.mktemp("pair")
    venv, pypi, pytorch = base / "venv", base / "pypi", base / "whl" / "cpu"
    pypi.mkdir()
    pytorch.mkdir(parents=True)
    assert _run([sys.executable, "-m", "venv", "--without-pip", venv]).returncode == 0
    python = venv / "bin" / "python"
    # The wheel's own dist-info, unpacked into the venv: what pip and site_torch.py read of an
    # installed torch (its version, tag and requirements), without unpacking 190 MB of library
    # (30 s on two busy cores) that no dry run opens.
    import zipfile

    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    with zipfile.ZipFile(WHEEL_TORCH[0]) as wheel:
        wheel.extractall(purelib, [n for n in wheel.namelist() if n.split("/")[0].endswith(".dist-info")])
    # torch's own requirements (filelock, sympy, ...) as stubs installed beside it, so that pip
    # finds the environment whole when a torchvision asks for this torch
    from packaging.requirements import Requirement

    needs = _run([python, "-c", "import importlib.metadata as m; print(*(m.requires('torch') or []), sep='\\n')"])
    reqs = [Requirement(x) for x in needs.stdout.splitlines() if x and "extra ==" not in x]
    reqs = [r for r in reqs if r.marker is None or r.marker.evaluate()]
    for req in reqs:
        _stub_wheel(pypi, req.name, _stub_version(req, {}))
    if reqs:
        done = _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-index", "--no-deps",
                     "--find-links", pypi, *[r.name for r in reqs]])
        assert done.returncode == 0, done.stderr
    _stub_wheel(pypi, "torchvision", "0.28.0", ("torch==2.13.0",))
    _stub_wheel(pypi, "torchvision", "0.29.1", ("torch==2.14.1",))
    _stub_wheel(pytorch, "torchvision", "0.28.0+cpu", ("torch==2.13.0",))
    site = base / "site-torch.txt"
    pins = _run([python, ROOT / "workflow/envs/site_torch.py"])
    assert pins.stdout.strip() == "torch==2.13.0+cpu", pins.stdout + pins.stderr
    site.write_text(pins.stdout)
    return dict(python=python, pypi=pypi, pytorch=pytorch.parent, site=site, env=_isolated())


def _dry_run_argv(command: str, ctx: dict, requirements: list[str]) -> list[str]:
    """A printed `pip install ...` as pip runs it here: offline, the stand-in indexes for PyPI
    and PyTorch's, `-e ".[x]"` as the extra's own requirements (the project's base ones do not
    name torchvision), site-torch.txt the venv's."""
    import shlex

    from marble.runtime import install

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    words, out = iter(shlex.split(command, comments=True)[2:]), []
    for word in words:
        if word == "-c":
            name = next(words)
            out += ["-c", str(ctx["site"]) if name == "site-torch.txt" else name]
        elif word == "-e":
            requirements += [r for x in re.search(r"\[([a-z,]+)\]", next(words)).group(1).split(",") for r in extras[x]]
        elif word == "-r":
            requirements += [x for x in (ROOT / next(words)).read_text().splitlines() if x and not x.startswith("#")]
        elif word in ("--index-url", "--extra-index-url"):
            url = next(words)
            if url.startswith(install.PYTORCH_INDEX):  # PyTorch's index: its stand-in folder
                out += ["--find-links", str(ctx["pytorch"] / url.removeprefix(install.PYTORCH_INDEX))]
        elif word == "--find-links":
            out += ["--find-links", str(ctx["pypi"].parent / next(words))]  # SITE_WHEELS: an empty place
        elif word.startswith("-"):
            out.append(word)
        else:
            requirements.append(word)
    return out


def _would_install(command: str, ctx: dict) -> dict[str, str]:
    """{name: version} pip's dry run of `command` (each `&&` part) would install in the venv."""
    from packaging.requirements import Requirement

    pins = {name.strip().lower().replace("_", "-"): version.strip() for name, version in
            (line.split("==", 1) for line in (ROOT / "workflow/envs/constraints.txt").read_text().splitlines()
             if "==" in line and not line.startswith("#"))}
    got = {}
    # each command of a chain ("A && B", the mmcv recipe's "A, then B"), from its `pip install`
    # to before a parenthesis of prose
    for part in re.split(r" && |, then ", command):
        part = part[part.index("pip install"):].split(" (")[0]
        requirements: list[str] = []
        options = _dry_run_argv(part, ctx, requirements)
        if not requirements:
            continue  # no requirement of its own (a `--no-deps` install of downloaded files)
        for text in requirements:
            req = Requirement(text)
            if req.name not in ("torch", "torchvision"):
                _stub_wheel(ctx["pypi"], req.name, _stub_version(req, pins))
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(ctx["python"]), "install", "--dry-run", "--no-index",
             "--find-links", str(ctx["pypi"]), *options, *requirements],
            cwd=ROOT, capture_output=True, text=True, timeout=300, check=False, env=ctx["env"])
        assert proc.returncode == 0, (command, proc.stdout[-1500:], proc.stderr[-1500:])
        line = next((x for x in proc.stdout.splitlines() if x.startswith("Would install ")), "")
        got.update(w.rsplit("-", 1) for w in line.removeprefix("Would install ").split())
    return got


def test_every_hint_keeps_torch_and_torchvision_a_pair_beside_a_wheel_torch(torch_venv, monkeypatch):
    """Every printed hint, as printed for a venv holding the wheel torch 2.13.0+cpu and no
    torchvision, through pip's dry run in that venv: torch stays, and a torchvision it would
    install is the +cpu build. The geneval and clip hints used to pull PyPI's torchvision beside
    it (`operator torchvision::nms does not exist` once installed for real): the control below."""
    from marble.runtime import install

    monkeypatch.setattr(install, "installed", {"torch": "2.13.0+cpu", "torchvision": None}.get)
    # as printed here: the torchvision hint of this torch, not those _hints renders for other builds
    other = {install.torchvision(v) for v in ("2.14.1+cu128", "2.14.1")}
    hints = sorted({h for _, h in _hints()} - other | {install.torchvision("2.13.0+cpu")})
    paired = 0
    for hint in hints:
        got = _would_install(hint, torch_venv)
        assert "torch" not in got, (hint, got)
        assert got.get("torchvision", "+cpu").endswith("+cpu"), (hint, got)
        paired += "torchvision" in got
    assert paired >= 3  # the torchvision hint, geneval's and clip's
    control = _would_install('pip install -c site-torch.txt -e ".[geneval]"', torch_venv)
    assert control["torchvision"] == "0.28.0"  # PyPI's: the broken pair the old hint made


def test_a_sites_own_torch_tag_is_never_a_pytorch_index():
    """`+site` and `+computecanada` builds have no PyTorch index (`.../whl/computecanada` does not
    exist): their hints take torchvision from where the site's torch came from."""
    from marble.runtime import install

    for version in ("2.14.1+site", "2.14.1+computecanada"):
        for hint in (install.torchvision(version), install.extra("geneval", version, None)):
            assert install.PYTORCH_INDEX not in hint and "--find-links SITE_WHEELS" in hint, hint
            assert '"torchvision==0.29.*"' in hint, hint
    # the extra: torchvision from the site first, then the extra (the note after both: a shell comment)
    chain = install.extra("clip", "2.14.1+site", None)
    assert chain.index("--find-links SITE_WHEELS") < chain.index('-e ".[clip]"') < chain.index("#")
    assert install.extra("clip", "2.14.1+site", "0.29.0+site").endswith('-e ".[clip]"')  # there already
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert install.TORCHVISION_EXTRAS == {x for x, reqs in extras.items() if "torchvision" in reqs}
