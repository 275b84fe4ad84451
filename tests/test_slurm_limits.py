"""Time limits (marble.workflow.slurm_limits, the doctor's "slurm fits <job>" rows):
`sbatch --test-only` accepts a 2,880-min job on a 60-min partition under SLURM's default
EnforcePartLimits=NO, so the doctor reads the partition's MaxTime and the QOS / association
MaxWall itself. Parsers against what scontrol / sinfo / sacctmgr print; the doctor end to end
with stub SLURM commands whose partition says MaxTime = 1 h."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from marble import doctor, doctor_slurm
from marble.workflow import slurm_limits as limits

ROOT = Path(__file__).resolve().parents[1]

# `scontrol show partition -o` as SLURM 23 prints it (one line per partition).
SCONTROL = (
    "PartitionName=cpu AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=YES QoS=N/A "
    "DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO MaxNodes=UNLIMITED "
    "MaxTime=2-00:00:00 MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=cpu[01-04] State=UP\n"
    "PartitionName=gpu AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=NO QoS=gpuqos "
    "DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO MaxNodes=UNLIMITED "
    "MaxTime={gpu_max} MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=gpu[01-02] State=UP\n")


@pytest.mark.parametrize("text, minutes", [
    ("60", 60), ("90:30", 91), ("01:00:00", 60), ("1:00:00", 60), ("1-00:00:00", 1440),
    ("2-00", 2880), ("1-12:30", 2190), ("00:00:01", 1), ("UNLIMITED", None), ("infinite", None), ("", None)])
def test_slurm_time_strings_in_minutes(text, minutes):
    assert limits.slurm_minutes(text) == minutes


def test_a_time_that_is_not_slurms_is_an_error_not_unlimited():
    with pytest.raises(ValueError, match="not a SLURM time"):
        limits.slurm_minutes("1h")


def test_partitions_from_scontrol_and_sinfo():
    parts = limits.parse_partitions(SCONTROL.format(gpu_max="01:00:00"))
    assert parts["gpu"]["MaxTime"] == "01:00:00" and limits.partition_qos(parts["gpu"]) == "gpuqos"
    assert limits.default_partition(parts) == "cpu" and limits.partition_qos(parts["cpu"]) is None
    # The block form (no -o) parses the same.
    block = SCONTROL.format(gpu_max="1:00:00").replace(" Allow", "\n   Allow")
    assert limits.parse_partitions(block)["gpu"]["MaxTime"] == "1:00:00"
    sinfo = limits.parse_sinfo_limits("cpu* 2-00:00:00\ngpu 1:00:00\n")
    assert sinfo["gpu"]["MaxTime"] == "1:00:00" and limits.default_partition(sinfo) == "cpu"


def test_the_jobs_qos_is_the_associations_default_else_its_only_one_else_normal():
    text = "proj42||||\nproj42|gpu|long|long,normal|1-00:00:00\nteam7||||\n"
    rows = limits.parse_assoc(text, "proj42", "gpu")
    assert [r["partition"] for r in rows] == ["", "gpu"]  # all partitions + this one; not team7's
    assert [limits.job_qos(r) for r in rows] == ["normal", "long"]
    assert limits.job_qos(dict(default_qos="", qos="short")) == "short"
    assert limits.parse_assoc(text, "proj42", "cpu") == rows[:1]
    assert limits.parse_qos_maxwall("normal|1-00:00:00\nlong|\n") == {"normal": "1-00:00:00", "long": ""}


def test_time_verdict_names_the_shortest_limit_and_what_was_not_read():
    found = [("partition gpu MaxTime", 2880), ("QOS normal MaxWall", 1440)]
    assert limits.time_verdict(2880, found, []) == (False, "2880 min > QOS normal MaxWall 1440 min")
    ok, words = limits.time_verdict(600, found, ["QOS x: MaxWall not readable"])
    assert ok is True and "within partition gpu MaxTime 2880 min" in words and "not read: QOS x" in words
    assert limits.time_verdict(2880, [("partition gpu MaxTime", None)], [])[0] is True
    assert limits.time_verdict(60, [], ["sacctmgr does not answer"]) == (
        None, "time limit not read (sacctmgr does not answer)")


def _stub(bin_dir: Path, name: str, text: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text(f"#!/bin/sh\n{text}\n")
    (bin_dir / name).chmod(0o755)


def _site(tmp_path: Path, gpu_max: str, sacctmgr: str = "exit 1") -> Path:
    """A workflow folder with config/paper.yaml + site.yaml, and stub SLURM commands on a
    cluster where every job shape fits `sbatch --test-only` (SLURM's default
    EnforcePartLimits=NO: it does not look at MaxTime)."""
    root = tmp_path / "wf"
    (root / "workflow/schemas").mkdir(parents=True)
    shutil.copy2(ROOT / "workflow/schemas/config.schema.yaml", root / "workflow/schemas")
    (root / "config").mkdir()
    for name in ("paper.yaml", "eval.yaml"):
        shutil.copy2(ROOT / "config" / name, root / "config")
    (root / "site.yaml").write_text(yaml.safe_dump({"cluster": {
        "partition": "cpu", "gpu_partition": "gpu", "gpu_type": "h100", "account": "proj42"}}))
    bin_dir = tmp_path / "bin"
    (tmp_path / "scontrol.txt").write_text(SCONTROL.format(gpu_max=gpu_max))
    _stub(bin_dir, "scontrol", f'case "$1" in ping) echo "Slurmctld(primary) at ctl is UP";; '
          f'show) cat {tmp_path / "scontrol.txt"};; esac')
    _stub(bin_dir, "sinfo", 'case "$*" in *"-p gpu"*) echo "gpu gpu:h100:8";; *) echo "cpu (null)";; esac')
    _stub(bin_dir, "sbatch", 'echo "sbatch: Job 7 to start at 2026-12-03T01:00:00 using 16 processors" >&2')
    _stub(bin_dir, "sacctmgr", sacctmgr)
    return root


def test_doctor_fails_the_training_row_naming_a_one_hour_partition_limit(tmp_path, monkeypatch, capsys):
    """`marble doctor --configfile config/paper.yaml site.yaml` where the GPU partition's MaxTime
    is 1 h: every shape passes --test-only, yet the 2,880-min training's row fails naming the
    limit, and its fix says how the training runs anyway (runtime at the limit + requeue)."""
    root = _site(tmp_path, "01:00:00")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    config = doctor.load_workflow_config(["config/paper.yaml", "site.yaml"], root)
    rows = {r.name: r for r in doctor_slurm.slurm_rows(config)}
    train = rows["slurm fits train_run"]
    assert train.status == "FAIL", train
    assert "2880 min > partition gpu MaxTime 60 min" in train.detail
    assert "train.runtime: 60" in train.fix and "requeue" in train.fix
    assert rows["slurm fits report"].status == "ok"  # 60 min on cpu (2 days)
    # The same through the command line, as docs/cluster.md has users run it.
    monkeypatch.setattr(doctor, "run_checks", lambda config, *a, **k: doctor_slurm.slurm_rows(config))
    assert doctor.main(["--root", str(root), "--configfile", "config/paper.yaml", "site.yaml"]) == 1
    out = capsys.readouterr().out
    assert "slurm fits train_run" in out and "partition gpu MaxTime 60 min" in out


def test_qos_maxwall_binds_where_the_partition_allows_more(tmp_path, monkeypatch):
    sacctmgr = ('case "$*" in *"show assoc"*) echo "proj42||||";; '
                '*"show qos"*) printf "normal|1-00:00:00\\ngpuqos|\\n";; *) echo proj42;; esac')
    root = _site(tmp_path, "UNLIMITED", sacctmgr)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    config = doctor.load_workflow_config(["config/paper.yaml", "site.yaml"], root)
    rows = {r.name: r for r in doctor_slurm.capacity_rows(config)}
    train = rows["slurm fits train_run"]
    assert train.status == "FAIL" and "2880 min > QOS normal MaxWall 1440 min" in train.detail
    assert "train.runtime: 1440" in train.fix
    evaluate = rows["slurm fits evaluate_ckpt"]
    assert evaluate.status == "ok" and "QOS gpuqos MaxWall unlimited" in evaluate.detail


def test_unreadable_limits_are_said_not_passed(tmp_path, monkeypatch):
    """No partition limits anywhere (scontrol and sinfo say nothing of time), no slurmdbd: a
    warning that says what was not read, never "ok"."""
    root = _site(tmp_path, "01:00:00")
    _stub(tmp_path / "bin", "scontrol", 'case "$1" in ping) echo "Slurmctld(primary) at ctl is UP";; *) exit 1;; esac')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    config = doctor.load_workflow_config(["config/paper.yaml", "site.yaml"], root)
    train = {r.name: r for r in doctor_slurm.capacity_rows(config)}["slurm fits train_run"]
    assert train.status == "warn" and "time limit not read" in train.detail
    assert "sacctmgr does not answer" in train.detail and "partition gpu" in train.detail


@pytest.mark.slurm
def test_a_one_hour_partition_of_the_localhost_slurm_fails_the_training_row(tmp_path):
    """The real slurmctld: a partition created with MaxTime=60 beside the default one, the tiny
    default's CPU training asking 2,880 min there. `sbatch --test-only` accepts it (`Job N to
    start at ...`: EnforcePartLimits=NO, SLURM's default); the row fails naming the limit."""
    import subprocess

    from test_slurm import _slurm_ready

    reason = _slurm_ready()
    if reason:
        pytest.skip(reason)
    nodes = subprocess.run(["sinfo", "-h", "-o", "%N"], capture_output=True, text=True, check=True,
                           timeout=60).stdout.split()[0]
    part = "marble-short"
    subprocess.run(["scontrol", "create", f"PartitionName={part}", f"Nodes={nodes}", "MaxTime=60",
                    "State=UP"], check=True, timeout=60)
    try:
        site = {"cluster": {"partition": part, "gpu_partition": part, "account": None}}
        config = doctor.load_workflow_config([], ROOT)  # the tiny default: CPU jobs only
        config = {**config, "cluster": {**config["cluster"], **site["cluster"]},
                  "train": {**config["train"], "runtime": 2880}}
        rows = {r.name: r for r in doctor_slurm.capacity_rows(config)}
    finally:
        subprocess.run(["scontrol", "delete", f"PartitionName={part}"], check=False, timeout=60)
    train = rows["slurm fits train_run"]
    assert train.status == "FAIL" and f"2880 min > partition {part} MaxTime 60 min" in train.detail, train
    assert "train.runtime: 60" in train.fix
    # SLURM's own --test-only accepted it (EnforcePartLimits=NO): the row failed on the limit alone.
    assert "to start at" in train.detail
    report = rows.get("slurm fits report")
    assert report is None or "MaxTime 60 min" in report.detail
