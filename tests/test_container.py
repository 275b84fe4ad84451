"""The container recipe (container/Containerfile, .dockerignore) cannot drift from the install
recipe of docs/cluster.md: the same constraint files in every pip call, the paper extras, the
torch pair the project pins, and a build context that holds the source and nothing a machine
generated. No podman here: `make test-container` builds the image and runs the demo in it."""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONTAINERFILE = ROOT / "container/Containerfile"
IGNORE = ROOT / ".dockerignore"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Containerfile, continuation lines joined, comments dropped."""
    joined, out = "", []
    for line in text.splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        joined += line.rstrip()
        if joined.endswith("\\"):
            joined = joined[:-1] + " "
            continue
        word, _, args = joined.strip().partition(" ")
        out.append((word.upper(), " ".join(args.split())))
        joined = ""
    return out


def pip_installs(steps: list[tuple[str, str]]) -> list[list[str]]:
    """The argv of every `pip install` the RUN steps call."""
    calls = []
    for word, args in steps:
        if word == "RUN":
            for command in re.split(r"&&|;", args):
                argv = shlex.split(command)
                if argv[:2] == ["pip", "install"]:
                    calls.append(argv[2:])
    return calls


def arg_default(steps: list[tuple[str, str]], name: str) -> str:
    found = [a.split("=", 1)[1] for w, a in steps if w == "ARG" and a.startswith(f"{name}=")]
    assert len(found) == 1, f"Containerfile: one ARG {name}=... expected, found {found}"
    return found[0]


def pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==")
            out[name.strip().lower()] = version.strip()
    return out


STEPS = instructions(CONTAINERFILE.read_text())


def test_every_pip_call_keeps_the_projects_pins():
    """torch first from constraints-clip.txt (the CUDA pair), everything after it under both
    constraint files, as docs/cluster.md's recipe: no call can resolve another torch."""
    copied = {}
    for word, args in STEPS:
        if word == "COPY" and "workflow/envs/" in args:
            *sources, dest = args.split()
            copied.update({f"{dest.rstrip('/')}/{Path(s).name}": ROOT / s for s in sources})
    calls = pip_installs(STEPS)
    assert calls, "Containerfile: no pip install"
    torch_pair = [c for c in calls if "-r" in c]
    assert len(torch_pair) == 1, torch_pair
    assert copied[torch_pair[0][torch_pair[0].index("-r") + 1]] == ROOT / "workflow/envs/constraints-clip.txt"
    assert calls.index(torch_pair[0]) <= 1, "Containerfile: torch is not the first install"
    for call in calls:
        if call in (["--upgrade", "pip"], torch_pair[0]) or "--no-deps" in call:
            continue
        constraints = {copied[call[i + 1]] for i, a in enumerate(call) if a == "-c"}
        assert constraints == {ROOT / "workflow/envs/constraints.txt", ROOT / "workflow/envs/constraints-clip.txt"}, (
            f"Containerfile: `pip install {' '.join(call)}` is not under both constraint files")
    pair = pins(ROOT / "workflow/envs/constraints-clip.txt")
    # PyPI's Linux torch of a plain version is the CUDA build; a local tag (+cpu) would not be.
    assert set(pair) == {"torch", "torchvision"} and all("+" not in v for v in pair.values()), pair


def test_extras_are_the_paper_install_of_the_docs():
    cluster = (ROOT / "docs/cluster.md").read_text()
    documented = re.search(r"-c workflow/envs/constraints\.txt -e '\.\[([\w,]+)\]'", cluster).group(1)
    assert arg_default(STEPS, "EXTRAS") == documented
    test_sh = (ROOT / "container/test.sh").read_text()
    assert f'extras="${{EXTRAS:-{documented}}}"' in test_sh
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(documented.split(",")) <= set(extras)


def test_base_needs_no_registry():
    """The default base is the one container/base.sh builds with debootstrap (no docker.io)."""
    base = arg_default(STEPS, "BASE")
    assert base.startswith("localhost/") and base in (ROOT / "container/base.sh").read_text()
    assert STEPS[STEPS.index(("ARG", f"BASE={base}")) + 1] == ("FROM", "${BASE}")


def ignore_regexes() -> list[re.Pattern]:
    """.dockerignore as Docker and podman read it: paths relative to the context, `*` within
    one path element, `**` across any, and an excluded folder excludes all below it."""
    out = []
    for line in IGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        assert not line.startswith("!"), ".dockerignore: re-includes (!) are not modelled here"
        parts = re.split(r"(\*\*/?|\*|\?)", line.strip("/"))
        body = "".join({"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(p, re.escape(p))
                       for p in parts)
        out.append(re.compile(rf"{body}(?:/.*)?"))
    return out


def excluded(path: str) -> bool:
    return any(rx.fullmatch(path) for rx in ignore_regexes())


@pytest.mark.parametrize("path", [
    ".venv/bin/python", ".venv-clip/lib/x.py", ".venv-mmdet/bin/pip", ".git/HEAD",
    "data/models/tiny-sd3/model_index.json", "results/runs/marble/train_summary.json",
    ".cache/pip-container/http/x", ".cache/container/rootfs/etc/passwd", ".snakemake/log/x.log",
    "marble/__pycache__/cli.cpython-311.pyc", "marble.egg-info/PKG-INFO", "logs/train/x.log",
])
def test_context_leaves_out(path):
    assert excluded(path), f".dockerignore lets {path} into the image's build context"


def test_context_holds_the_source():
    """Every file git tracks outside data/ and results/ (the demo makes those) goes in."""
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True,
                             check=True).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    dropped = [p for p in tracked if excluded(p) and not p.startswith(("data/", "results/"))]
    assert not dropped, f".dockerignore drops tracked source: {dropped[:10]}"
    assert "Snakefile" in tracked and "workflow/envs/constraints.txt" in tracked


def test_context_leaves_out_whatever_git_ignores():
    """What a machine generated here (git ignores it: venvs, caches, data, results) stays out."""
    ignored = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "--others", "--ignored", "--exclude-standard", "--directory"],
        capture_output=True, text=True, check=True).stdout.split()
    leaked = [p for p in ignored if not excluded(p.rstrip("/"))]
    assert not leaked, f".dockerignore lets in what git ignores: {leaked[:10]}"


def test_training_without_srun_in_the_image_says_what_to_bind(tmp_path):
    """A SLURM training job whose command runs in the image (--sdm apptainer) needs the site's
    srun there: without it the launcher stops at once with the fix, before any training."""
    bin_dir = tmp_path / "bin"  # bash and the coreutils the script uses, no srun
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "mkdir", "tee", "date", "cat"):
        found = subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True, text=True).stdout.strip()
        (bin_dir / tool).symlink_to(found)
    env = {"PATH": str(bin_dir), "SLURM_JOB_ID": "42", "APPTAINER_CONTAINER": "/project/marble.sif"}
    proc = subprocess.run(["bash", str(ROOT / "workflow/scripts/train_launch.sh"), "", "--", "--preset", "tiny"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "'srun' is not on PATH inside the container /project/marble.sif" in proc.stderr
    assert "docs/container.md" in proc.stderr and "torchrun" not in proc.stdout
