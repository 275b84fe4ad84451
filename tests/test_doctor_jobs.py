"""`marble doctor`'s job rows against the plan (issue 48), with the stub SLURM of
test_slurm_limits (every shape passes `sbatch --test-only`; the GPU partition's MaxTime is set
per test): a training attempt must hold one planned step after the requeue signal's lead, only
the jobs a target submits are checked, and each evaluation's --time (sized from the plan) is
compared with the limit, one row per job that does not fit."""

from __future__ import annotations

import shutil

import pytest
import yaml
from test_slurm_limits import ROOT, _site

from marble import doctor, doctor_slurm
from marble.workflow import preflight, slurm, slurm_eval
from marble.workflow import slurm_capacity as capacity


def _config(tmp_path, monkeypatch, gpu_max: str, files=("config/paper.yaml",), **site) -> tuple:
    root = _site(tmp_path, gpu_max)
    shutil.copy2(ROOT / "config/paper-eval.yaml", root / "config")
    base = yaml.safe_load((root / "site.yaml").read_text())
    (root / "site.yaml").write_text(yaml.safe_dump({**base, **site}))
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    return doctor.load_workflow_config([*files, "site.yaml"], root), root


def _rows(config, root, targets=()) -> dict:
    return {r.name: r for r in doctor_slurm.capacity_rows(config, root, targets)}


def test_a_training_attempt_too_short_for_one_step_is_refused(tmp_path, monkeypatch):
    """`train.runtime: 5` under the paper's 600-s lead used to pass (4 attempts in 4.5 min on
    the real SLURM, no step): refused, and the fix names a runtime that holds a step and the
    limit; a limit too short for any attempt gets no runtime suggested at all."""
    config, root = _config(tmp_path, monkeypatch, "1-00:00:00", train={"runtime": 5})
    train = _rows(config, root)["slurm fits train_run"]
    assert train.status == "FAIL" and "not longer than train.requeue_signal_s 600 s" in train.detail, train
    step_s, _ = capacity.plan_step_s(config, root)
    need = capacity.min_train_runtime(600, step_s)
    assert f"at least {need} min and at most 1440" in train.fix, train.fix
    # Longer than the lead, but what is left is shorter than a step (with its load).
    assert 60 < 2 * step_s  # 11 min leaves 60 s after the lead: less than a step with its load
    config["train"]["runtime"] = 11
    short = _rows(config, root)["slurm fits train_run"]
    assert short.status == "FAIL" and "requeues without progress" in short.detail, short
    config["train"]["runtime"] = need
    assert _rows(config, root)["slurm fits train_run"].status == "ok"
    # A 10-min partition: the old fix said `train.runtime: 10`, a job that never steps.
    config, root = _config(tmp_path / "b", monkeypatch, "00:10:00")
    train = _rows(config, root)["slurm fits train_run"]
    assert train.status == "FAIL" and "no train.runtime fits" in train.fix and "train.runtime: 10" not in train.fix


def test_the_workflow_refuses_a_runtime_within_the_signal_lead():
    train = dict(nodes=1, tasks=None, gpus_per_node=0, cpus_per_task=1, mem_mb=1000, runtime=10,
                 requeue_signal_s=600)
    cluster = dict(partition=None, gpu_partition=None, account=None, gpu_type=None, constraint=None)
    with pytest.raises(ValueError, match=r"train.runtime: 10 min is not longer than train.requeue_signal_s \(600 s\)"):
        slurm.train_resources(train, cluster)
    assert slurm.train_resources({**train, "runtime": 11}, cluster)["runtime"] == 11


def test_an_evaluation_only_config_is_checked_for_its_own_jobs(tmp_path, monkeypatch):
    """config/paper-eval.yaml (`runs: {}`) under `eval_only` on a 1-h partition: no training
    row (the schema's 120-min default failed it) and no bench row; the target reaches the
    doctor through the preflight snapshot."""
    config, root = _config(tmp_path, monkeypatch, "01:00:00", files=("config/paper-eval.yaml",))
    rows = _rows(config, root, ["eval_only"])
    assert not any(name.startswith(("slurm fits train_run", "slurm fits bench_step")) for name in rows), rows
    assert "slurm fits bench_step" in _rows(config, root, ["all"])  # `all` does bench
    snap = tmp_path / "snap.json"
    snap.write_text(preflight.snapshot_text(config, [], targets=["eval_only"]))
    assert preflight.snapshot_targets(snap) == ["eval_only"]
    assert capacity.named_targets(["--profile", "slurm", "eval_only", "-n"]) == ["eval_only"]
    # A narrower target keeps the snapshot (no doctor rerun); a wider one adds its jobs.
    both = ["cost", "eval_only"]
    assert preflight.wanted_text(snap, config, [], ["cost"]) == preflight.snapshot_text(config, [], both)
    assert preflight.wanted_text(snap, config, [], ["eval_only"]) == snap.read_text()
    assert preflight.wanted_text(snap, config, [], []) == preflight.snapshot_text(config, [])  # every job
    snap.write_text(preflight.snapshot_text(config, []))  # checked for `all`
    assert preflight.wanted_text(snap, config, [], ["eval_only"]) == snap.read_text()


@pytest.mark.parametrize("gpu_max, fits", [("1-00:00:00", True), ("01:00:00", False)])
def test_each_evaluation_job_is_compared_with_its_limit(tmp_path, monkeypatch, gpu_max, fits):
    """The doctor's own old advice (`eval.resources.runtime: 60`) passed while the plan puts 9
    of the 36 evaluations over an hour (FLUX-dev GenEval 5.8 h): each job now asks the plan's
    minutes, and on a 1-h partition each that cannot fit fails by name; a 24-h one passes."""
    eval_res = {"cpus_per_task": 16, "mem_mb": 120000, "runtime": 60, "gpus": 1}
    config, root = _config(tmp_path, monkeypatch, gpu_max, files=("config/paper-eval.yaml",),
                           eval={"resources": eval_res})
    rows = _rows(config, root, ["eval_only"])
    planned = slurm_eval.planned_jobs(config, root, trains=False)
    over = {job for job, _, minutes in planned if minutes > 60}  # with the margin and load time
    over_an_hour = {job for job, hours, _ in planned if hours and hours > 1}
    assert len(planned) == 36 and len(over_an_hour) == 9 and over_an_hour <= over and "flux_dev/geneval" in over
    per_job = {name.removeprefix("slurm fits evaluate_ckpt "): r for name, r in rows.items()
               if name.startswith("slurm fits evaluate_ckpt ")}
    if fits:
        assert rows["slurm fits evaluate_ckpt"].status == "ok" and not per_job, rows
        assert all(r.status == "ok" for name, r in rows.items() if name.startswith("slurm fits")), rows
    else:
        assert rows["slurm fits evaluate_ckpt"].status == "FAIL"
        assert set(per_job) == over and all(r.status == "FAIL" for r in per_job.values())
        assert "partition gpu MaxTime 60 min" in per_job["flux_dev/geneval"].detail
