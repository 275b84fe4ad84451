"""Helpers and the shared pipeline fixture for the workflow, DVC and SLURM tests.

Every test runs in a temporary git copy of the workflow files, never in the real tree.
The `tiny_pipeline` fixture runs the CI config (.test/config.yaml, copied over
config.yaml) once per session through `dvc repro`, whose stages run `snakemake -c2
<target>`; the end-to-end, DVC and eval_only tests all read that one run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
WORKFLOW_FILES = [
    "Snakefile", "workflow", "config.yaml", "config", ".test", "slurm", "dvc.yaml", ".dvcignore",
    "params.yaml", ".dvc",
]
# DVC stages hash these code folders as dependencies.
CODE_DIRS = ["marble"]
# What dvc.yaml's stages pass to Snakemake (no mtime trigger: DVC re-links outputs).
DVC_TRIGGERS = ["--rerun-triggers", "params", "input", "code"]


def env() -> dict:
    out = dict(os.environ)
    out["PATH"] = f"{BIN}:{out.get('PATH', '')}"
    out.setdefault("PYTHONUNBUFFERED", "1")
    return out


def copy_workflow(dest: Path, config: str | None = ".test/config.yaml") -> Path:
    """A fresh git repo at `dest` holding the workflow files (config.yaml := `config`)."""
    dest.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".snakemake", "cache", "tmp",
                                    "config.local")
    for name in WORKFLOW_FILES + CODE_DIRS:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore, dirs_exist_ok=True)
        elif src.exists():
            shutil.copy2(src, dest / name)
    if config:
        shutil.copy2(ROOT / config, dest / "config.yaml")
    (dest / ".gitignore").write_text(
        "/data/\n/results/\n/logs/\n/benchmarks/\n.snakemake/\n__pycache__/\n", encoding="utf-8"
    )
    run(["git", "init", "-q"], dest)
    run(["git", "-c", "user.email=ci@marble", "-c", "user.name=ci", "add", "-A"], dest)
    run(["git", "-c", "user.email=ci@marble", "-c", "user.name=ci", "commit", "-qm", "init"], dest)
    return dest


def copy_inputs(src: Path, dest: Path, subs: list[str]) -> None:
    """Copy pipeline inputs (model, prompts, tables) with one old mtime for all, so
    Snakemake takes them as done whatever order a `dvc pull` restored them in."""
    old = time.time() - 3600
    for sub in subs:
        shutil.copytree(src / sub, dest / sub)
        for path in [dest / sub, *(dest / sub).rglob("*")]:
            os.utime(path, (old, old))


def run(cmd: list[str], cwd: Path, check: bool = True, timeout: float = 900,
        log: Path | None = None) -> subprocess.CompletedProcess:
    """Run a command; on failure the error shows its output (and the tail of `log`)."""
    proc = subprocess.run(cmd, cwd=cwd, env=env(), capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        extra = ""
        for path in sorted((cwd / "logs").rglob("*.log")) if (cwd / "logs").is_dir() else []:
            extra += f"\n--- {path.relative_to(cwd)} (tail)\n" + path.read_text(errors="replace")[-1500:]
        raise AssertionError(
            f"{' '.join(map(str, cmd))} exited {proc.returncode} in {cwd}\n"
            f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-6000:]}{extra}"
        )
    return proc


def snakemake(args: list[str], cwd: Path, **kw) -> subprocess.CompletedProcess:
    return run([str(BIN / "snakemake"), *args], cwd, **kw)


def dvc(args: list[str], cwd: Path, **kw) -> subprocess.CompletedProcess:
    return run([str(BIN / "dvc"), *args], cwd, **kw)


def dry_run_outputs(cwd: Path, target: str, extra: list[str] = ()) -> dict[str, set[str]]:
    """{rule: output paths} of every job of `target`, forced, from a dry run."""
    proc = snakemake(["-n", "--forceall", target, *extra], cwd)
    outputs: dict[str, set[str]] = {}
    rule = None
    for line in proc.stdout.splitlines():
        stripped = line.strip()
        if stripped.startswith(("rule ", "localrule ", "checkpoint ", "localcheckpoint ")) \
                and stripped.endswith(":"):
            rule = stripped.split()[1].rstrip(":")
            outputs.setdefault(rule, set())
        elif stripped.startswith("output:") and rule:
            outputs[rule] |= {p.strip() for p in stripped[len("output:"):].split(",") if p.strip()}
    return outputs


def init_dvc(cwd: Path) -> None:
    """The repository's committed .dvc/ (config, plot templates) makes a clone a DVC
    repo; `dvc init` only where a test copied no .dvc/."""
    if not (cwd / ".dvc" / "config").is_file():
        dvc(["init", "-q"], cwd)
        dvc(["config", "core.analytics", "false"], cwd)


_PIPELINE: dict = {}  # one run per session: each importing module gets its own fixture


@pytest.fixture(scope="session")
def tiny_pipeline(tmp_path_factory) -> dict:
    if not _PIPELINE:
        _PIPELINE.update(_shared_pipeline(tmp_path_factory))
    return _PIPELINE


def _shared_pipeline(tmp_path_factory) -> dict:
    """One build per test session. Under pytest-xdist (`make test`) each worker is its own
    process: the first to ask builds under a file lock in the session's shared temp folder,
    the others wait for it and read its record, instead of each paying the ~4 min build."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get("MARBLE_TEST_PIPELINE_DIR"):
        return _make_pipeline(tmp_path_factory.mktemp("pipeline"))
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent  # pytest-N/, above each worker's popen-gwK/
    record = shared / "pipeline.json"
    with FileLock(str(shared / "pipeline.lock")):
        if not record.is_file():
            made = _make_pipeline(Path(tempfile.mkdtemp(prefix="pipeline-", dir=shared)))
            tmp = record.with_suffix(".tmp")
            tmp.write_text(json.dumps({**made, "dir": str(made["dir"])}))
            tmp.replace(record)
    made = json.loads(record.read_text())
    return {**made, "dir": Path(made["dir"])}


def _make_pipeline(base: Path) -> dict:
    """The CI pipeline run once through `dvc repro` in a temp git copy under `base`.

    MARBLE_TEST_PIPELINE_DIR (developers only) reuses a folder a previous session made.
    """
    reuse = os.environ.get("MARBLE_TEST_PIPELINE_DIR")
    if reuse:
        work = Path(reuse)
        dry_all = snakemake(["-n", "all", *DVC_TRIGGERS], work)
        return {"dir": work, "wall_s": float("nan"), "dry_all": dry_all.stdout + dry_all.stderr}
    work = copy_workflow(base / "repo")
    init_dvc(work)
    start = time.perf_counter()
    dvc(["repro"], work, timeout=1500)
    wall = time.perf_counter() - start
    print(f"\n[bench] tiny CI pipeline via dvc repro (snakemake -c2 per stage): {wall:.1f} s")
    # Checked here, before other tests touch the folder (a dvc pull resets mtimes).
    dry_all = snakemake(["-n", "all", *DVC_TRIGGERS], work)
    return {"dir": work, "wall_s": wall, "dry_all": dry_all.stdout + dry_all.stderr}
