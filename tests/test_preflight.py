"""The preflight gates every job of every target (marble.workflow.preflight, the Snakefile's
gate): each target's DAG has an edge from the preflight to every other job; with stub SLURM
commands and a stub `marble` recording each call, a failing doctor leaves zero sbatch calls
and zero downloads, a passing one is followed by the plan; a changed config reruns it."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import yaml
from test_workflow_lib import BIN, ROOT, copy_workflow, env, snakemake

from marble.workflow import preflight

PAPER = ["--configfile", "config/paper.yaml"]
# `eval_only` defines no training rule: its DAG cannot be built beside `all`'s.
PAPER_TARGETS = ["all", "table1", "rho_ablation", "harmony", "cost", "paper_tables", "prepare"]

# Every stub appends one line to $STUB_DIR/calls.log, in call order.
SLURM_STUB = """#!/bin/sh
echo "{name} $*" >> "$STUB_DIR/calls.log"
case {name} in
  sbatch) cat > /dev/null; echo 4242 ;;
  scontrol) echo "MinJobAge = 600 sec" ;;
esac
exit 0
"""
# `marble doctor` passes or fails as $STUB_DOCTOR_RC says; every other `marble` call (the
# downloads) is recorded and does nothing.
MARBLE_STUB = """#!/bin/sh
echo "marble $*" >> "$STUB_DIR/calls.log"
[ "$1" = doctor ] && {{ echo "stub doctor rc=$STUB_DOCTOR_RC"; exit "$STUB_DOCTOR_RC"; }}
exit 0
"""
# The hub fetches run `python -m marble.assets.hub`: recorded; any other python is the venv's.
PYTHON_STUB = """#!/bin/sh
if [ "$1 $2" = "-m marble.assets.hub" ]; then echo "fetch $*" >> "$STUB_DIR/calls.log"; exit 0; fi
exec {python} "$@"
"""


def _dag(work: Path, targets: list[str], extra: list[str]) -> str:
    return snakemake(["-n", "--forceall", "--dag", "dot", *targets, *extra], work).stdout


@pytest.fixture(scope="module")
def paper_work(tmp_path_factory) -> Path:
    work = copy_workflow(tmp_path_factory.mktemp("preflight") / "repo", config=None)
    (work / "site.yaml").write_text(yaml.safe_dump({"cluster": {
        "partition": "cpu", "gpu_partition": "gpu", "account": "proj42", "gpu_type": "h100"}}))
    return work


@pytest.mark.parametrize("config,groups", [
    (PAPER, [PAPER_TARGETS, ["eval_only"]]),
    ([], [["all", "prepare", "paper_tables"]]),  # the tiny default's own rules
])
def test_every_job_of_every_target_waits_for_the_preflight(paper_work, config, groups):
    for targets in groups:
        dot = _dag(paper_work, targets, config)
        assert dot.count("->") > 10, dot[-2000:]
        assert preflight.ungated_jobs(dot) == [], f"{targets}: jobs not after the preflight"


def test_ungated_jobs_reads_the_dag():
    dot = """digraph {
        0[label = "all", color = "0.1"];
        1[label = "preflight", color = "0.2"];
        2[label = "train_run\\nrun: a", color = "0.3"];
        3[label = "bench_step", color = "0.4"];
        1 -> 0
        1 -> 2
        2 -> 0
    }"""
    assert preflight.ungated_jobs(dot) == ["bench_step"]


def _stubs(tmp_path: Path, doctor_rc: int) -> tuple[dict, Path]:
    stubs = tmp_path / f"stubs{doctor_rc}"
    stubs.mkdir()
    for name in ["sbatch", "squeue", "sinfo", "scontrol", "sacct", "scancel", "sacctmgr", "sshare"]:
        (stubs / name).write_text(SLURM_STUB.format(name=name))
    (stubs / "marble").write_text(MARBLE_STUB)
    (stubs / "python").write_text(PYTHON_STUB.format(python=BIN / "python"))
    for path in stubs.iterdir():
        path.chmod(0o755)
    environ = env()
    environ.update(PATH=f"{stubs}:{environ['PATH']}", STUB_DIR=str(stubs),
                   STUB_DOCTOR_RC=str(doctor_rc))
    return environ, stubs / "calls.log"


def _calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def _queued(calls: list[str]) -> list[str]:
    return [c for c in calls if c.startswith(("sbatch", "marble download", "fetch"))]


def _snakemake_until(work: Path, environ: dict, targets: list[str], done, timeout=180) -> str:
    """Snakemake under the SLURM profile until it exits or `done()` holds (then killed: the
    stub jobs never finish); its output."""
    proc = subprocess.Popen(
        [str(BIN / "snakemake"), "--profile", "slurm", *targets, *PAPER, "site.yaml",
         # the plugin's first status check (40 s by default) also delays its shutdown
         "--slurm-init-seconds-before-status-checks", "1", "--seconds-between-status-checks", "1"],
        cwd=work, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + timeout
    while proc.poll() is None and not done() and time.time() < deadline:
        time.sleep(0.3)
    if proc.poll() is None:
        time.sleep(1.0)  # whatever else this round would start
        proc.kill()
    return proc.communicate(timeout=60)[0]


@pytest.mark.parametrize("targets", [PAPER_TARGETS, ["eval_only"]])
def test_failing_preflight_queues_and_downloads_nothing(paper_work, tmp_path, targets):
    """One Snakemake over every target at once: any job not behind the gate would be ready
    beside the preflight and start in the same scheduling round."""
    environ, log = _stubs(tmp_path, doctor_rc=1)
    out = _snakemake_until(paper_work, environ, targets, lambda: bool(_queued(_calls(log))))
    calls = _calls(log)
    assert any(c.startswith("marble doctor") for c in calls), out[-3000:]
    assert _queued(calls) == [], calls
    assert "Error in rule preflight" in out, out[-3000:]


def test_passing_preflight_is_followed_by_the_plan(paper_work, tmp_path):
    environ, log = _stubs(tmp_path, doctor_rc=0)
    out = _snakemake_until(paper_work, environ, ["all"],
                           lambda: any(c.startswith("sbatch") for c in _calls(log)))
    calls = _calls(log)
    doctor = next(i for i, c in enumerate(calls) if c.startswith("marble doctor"))
    queued = [i for i, c in enumerate(calls) if c in _queued(calls)]
    assert queued and min(queued) > doctor, f"{calls}\n{out[-3000:]}"
    assert any(c.startswith("marble download model") for c in calls), calls
    assert any(c.startswith("sbatch") for c in calls), calls


def test_changed_config_reruns_the_preflight_and_nothing_else(tmp_path):
    """The snapshot is the preflight's input; the gate never makes finished jobs outdated."""
    snap, gate = tmp_path / "results/preflight.config.json", tmp_path / "results/preflight.txt"
    assert preflight.sync_snapshot(snap, {"b": 1, "a": {"x": [1, 2]}})
    assert not preflight.sync_snapshot(snap, {"a": {"x": [1, 2]}, "b": 1})  # same config
    request = tmp_path / "results/preflight.request"
    assert preflight.ensure_gate(gate, request)
    assert 0 < gate.stat().st_mtime < request.stat().st_mtime  # the preflight must run
    first = request.read_text()
    assert not preflight.ensure_gate(gate, request) and request.read_text() == first
    gate.unlink()  # a failed doctor: Snakemake deleted its output
    assert preflight.ensure_gate(gate, request) and request.read_text() != first
    gate.write_text("doctor table\n")
    before = snap.stat().st_mtime_ns
    time.sleep(0.01)
    assert preflight.sync_snapshot(snap, {"a": {"x": [1, 3]}, "b": 1})
    assert snap.stat().st_mtime_ns > before and "3" in snap.read_text()
    assert not list(tmp_path.glob("results/.*tmp"))  # atomic: no temporary left behind


def test_config_switch_after_a_finished_run_plans_the_preflight(paper_work):
    """A dry run says the doctor runs first until it passed, and again after a config change;
    it still lists the whole plan (a due checkpoint would hide it)."""
    (paper_work / "results/preflight.txt").unlink(missing_ok=True)
    first = snakemake(["-n", "cost", *PAPER, "site.yaml"], paper_work)
    assert "marble doctor runs first (it has not passed here yet)" in first.stderr
    assert "bench_step" in _planned(first.stdout)
    (paper_work / "results/preflight.txt").write_text("doctor table\n")  # the doctor passed
    (paper_work.parent / "switch").mkdir(exist_ok=True)
    environ, _ = _stubs(paper_work.parent / "switch", doctor_rc=0)
    run_doctor = subprocess.run(  # a run with this config records it (the snapshot)
        # --nolock: an earlier test killed its Snakemake here (stub jobs never end)
        [str(BIN / "snakemake"), "-c1", "--nolock", "results/preflight.txt", "--forcerun", "preflight",
         *PAPER, "site.yaml"], cwd=paper_work, env=environ, capture_output=True, text=True,
        timeout=300, check=False)
    assert run_doctor.returncode == 0, run_doctor.stdout[-2000:] + run_doctor.stderr[-2000:]
    same = snakemake(["-n", "cost", *PAPER, "site.yaml"], paper_work)
    assert "runs first" not in same.stderr
    (paper_work / "site2.yaml").write_text("cluster:\n  partition: cpu2\n")
    other = snakemake(["-n", "cost", *PAPER, "site.yaml", "site2.yaml"], paper_work)
    assert "runs first (the configuration changed since it passed)" in other.stderr
    # ... and the plan is still shown: no params trigger makes the checkpoint due in a dry run
    assert "bench_step" in _planned(other.stdout), other.stdout[-2000:]


def _planned(stdout: str) -> set[str]:
    return {line.split()[1].rstrip(":") for line in stdout.splitlines()
            if line.startswith(("rule ", "localrule ", "checkpoint ", "localcheckpoint "))}


def test_snakefile_gates_after_every_include():
    """The gate is the Snakefile's last statement: a rule included later would be ungated."""
    text = (ROOT / "Snakefile").read_text()
    gate = text.index("wf_preflight.gate_rules(")
    assert "include:" not in text[gate:] and "rule " not in text[gate:]


def test_dry_run_warns_of_every_unpinned_hub_reference(paper_work):
    proc = snakemake(["-n", "eval_only", *PAPER], paper_work)
    warned = [line for line in proc.stderr.splitlines() if "is not pinned to a commit" in line]
    from marble.workflow import configs
    from marble.workflow.doctor_checks import unpinned_hub_references

    unpinned = unpinned_hub_references(configs.load(["config/paper.yaml"], paper_work))
    assert unpinned and len(warned) == len(unpinned), proc.stderr[-2000:]
    assert all(any(key in w for w in warned) for key in unpinned)


def test_slurm_profile_keeps_the_logs_the_docs_point_at():
    profile = yaml.safe_load((ROOT / "slurm/config.yaml").read_text())
    assert profile["slurm-keep-successful-logs"] is True


def test_a_dry_run_leaves_the_doctor_due_for_the_next_run(tmp_path):
    """A dry run writes the gate's files without making the doctor due; the next run renews
    the request past the placeholder, so the checkpoint runs."""
    gate, snap, req = (tmp_path / name for name in ("preflight.txt", "config.json", "request"))
    assert preflight.prepare_gate(gate, snap, req, {"a": 1}, execute=False) == \
        "it has not passed here yet"
    assert gate.stat().st_mtime > max(snap.stat().st_mtime, req.stat().st_mtime)  # not due
    assert preflight.prepare_gate(gate, snap, req, {"a": 1}, execute=True) is not None
    assert gate.stat().st_mtime < req.stat().st_mtime  # due: the request is newer
