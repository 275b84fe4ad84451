"""slurm/train.sbatch: one multi-node training without Snakemake. Its #SBATCH lines are the
paper's training job (the resources marble.workflow.slurm gives the workflow's train_run);
inside a job (stub srun / scontrol / torchrun) it makes the same srun step and torchrun call
as the workflow's launcher; on the localhost SLURM it trains the tiny model on one node."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from test_slurm import _slurm_ready, _step_stubs
from test_workflow_lib import ROOT, env
from tiny_tables import three_prompt_table

from marble.workflow import slurm

SBATCH = ROOT / "slurm" / "train.sbatch"


def _directives(text: str) -> dict[str, str]:
    """{option: value} of the #SBATCH lines ('' for a flag), comments dropped."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH "):
            option = line.removeprefix("#SBATCH ").split("#", 1)[0].strip()
            key, _, value = option.partition("=")
            out[key] = value
    return out


def test_sbatch_lines_are_the_paper_training_job():
    """Each #SBATCH line against config/paper.yaml's `train:` through the mapping the rule uses."""
    paper = yaml.safe_load((ROOT / "config/paper.yaml").read_text())["train"]
    train = dict(tasks=None, **paper)
    cluster = dict(partition=None, gpu_partition=None, account=None, gpu_type=None, constraint=None)
    res = slurm.train_resources(train, cluster)
    got = _directives(SBATCH.read_text())
    assert got["--nodes"] == str(res["nodes"]) and got["--ntasks-per-node"] == "1"
    assert "--ntasks-per-node=1" in res["slurm_extra"]
    assert got["--gres"] == res["gres"]  # gpu:8, per node
    assert got["--cpus-per-task"] == str(res["cpus_per_task"]) and got["--mem"] == str(res["mem_mb"])
    assert got["--time"] == str(res["runtime"])
    assert f"--signal={got['--signal']}" in res["slurm_extra"]  # USR1@600
    assert "--requeue" in got and got["--open-mode"] == "append"


def _torchrun_and_srun(tmp_path: Path, command: list[str], extra_env: dict) -> tuple[str, list[str]]:
    tmp_path.mkdir()
    environ = _step_stubs(tmp_path, "gpu01,gpu02", tasks=2)
    environ.update(extra_env)
    subprocess.run(command, cwd=ROOT, env=environ, check=True, timeout=60)
    stubs = Path(environ["STUB_DIR"])
    return (" ".join((stubs / "torchrun.argv").read_text().split()),
            sorted(a for a in (stubs / "srun.argv").read_text().split() if a.startswith("--")))


def test_sbatch_starts_the_same_step_and_torchrun_as_the_workflow(tmp_path):
    """Job 4242 on 2 nodes x 8 GPUs: the script's srun options and torchrun call equal those of
    workflow/scripts/train_launch.sh (the rule's launcher) for the same run."""
    marble_args = ["--preset", "rho_07", "--output-dir", str(tmp_path / "run"), "--set", "train.seed=3"]
    job = dict(SLURM_SUBMIT_DIR=str(ROOT), SLURM_NNODES="2", SLURM_CPUS_PER_TASK="64",
               SLURM_GPUS_ON_NODE="8", SLURM_JOB_NODELIST="gpu01,gpu02")
    ours = _torchrun_and_srun(tmp_path / "sbatch", ["bash", str(SBATCH), *marble_args], job)
    rule = _torchrun_and_srun(
        tmp_path / "rule", ["bash", "workflow/scripts/train_launch.sh", "srun", "--", *marble_args],
        dict(MARBLE_NODES="2", MARBLE_TASKS="2", MARBLE_CPUS_PER_TASK="64", MARBLE_GPUS_PER_NODE="8",
             MARBLE_RDZV_PORT=""))
    assert ours == rule, (ours, rule)
    torchrun, srun = ours
    assert "--nnodes 2 --nproc_per_node 8 --rdzv_backend c10d" in torchrun
    assert "--rdzv_endpoint gpu01:24242 --rdzv_id 4242" in torchrun and "-m marble.train --preset rho_07" in torchrun
    assert {"--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--cpus-per-task=64"} <= set(srun)


APPTAINER_STUB = """#!/usr/bin/env bash
# stand-in for `apptainer exec [options] IMAGE CMD...`: records its argv, runs CMD here
printf '%s\\n' "$@" > "$STUB_DIR/apptainer.argv"
[ "$1" = exec ] && shift
while [ "${1#--}" != "$1" ]; do shift; done
shift  # the image
exec "$@"
"""


def test_in_a_container_each_task_runs_under_apptainer_exec_and_the_batch_shell_requeues(tmp_path):
    """MARBLE_CONTAINER: the srun step runs `apptainer exec --nv IMAGE bash torchrun_slurm.sh`
    (srun outside the image), the rendezvous host looked up outside; a task that stops with a
    checkpoint but cannot requeue (no scontrol in the image: exit 75) is requeued by the batch
    shell."""
    (tmp_path / "x").mkdir()
    environ = _step_stubs(tmp_path / "x", "gpu01,gpu02", tasks=2)
    stubs = Path(environ["STUB_DIR"])
    # The stand-in runs the task with IN_IMAGE=1, where the stub scontrol is missing (127).
    (stubs / "apptainer").write_text(APPTAINER_STUB.replace("exec \"$@\"", "IN_IMAGE=1 exec \"$@\""))
    (stubs / "apptainer").chmod(0o755)
    # A torchrun whose worker stopped with a checkpoint, in an image without scontrol.
    (stubs / "torchrun").write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$STUB_DIR/torchrun.argv"\n'
                                    'echo "step 3 SIGUSR1" > "$MARBLE_REQUEUE_FILE"; exit 1\n')
    (stubs / "scontrol").write_text('#!/usr/bin/env bash\n[ "$1" = show ] && { tr , "\\n" <<<"$STEP_NODES"; exit 0; }\n'
                                    '[ -n "${IN_IMAGE:-}" ] && exit 127\n'
                                    'echo "scontrol $*" >> "$STUB_DIR/scontrol.log"\n')
    environ.update(SLURM_SUBMIT_DIR=str(ROOT), SLURM_NNODES="2", SLURM_CPUS_PER_TASK="64", SLURM_GPUS_ON_NODE="8",
                   SLURM_JOB_NODELIST="gpu01,gpu02", MARBLE_CONTAINER="/project/images/marble-cuda.sif")
    proc = subprocess.run(["bash", str(SBATCH), "--preset", "rho_07", "--output-dir", str(tmp_path / "run")],
                          cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 75, proc.stdout + proc.stderr
    apptainer = (stubs / "apptainer.argv").read_text().split()
    assert apptainer[:3] == ["exec", "--nv", "/project/images/marble-cuda.sif"]
    assert apptainer[3:5] == ["bash", "workflow/scripts/torchrun_slurm.sh"]
    srun = (stubs / "srun.argv").read_text().split()
    assert srun.index("apptainer") > srun.index("--kill-on-bad-exit=1")  # srun outside the image
    torchrun = " ".join((stubs / "torchrun.argv").read_text().split())
    assert "--rdzv_endpoint gpu01:24242" in torchrun
    assert (stubs / "scontrol.log").read_text().splitlines() == ["scontrol requeue 4242"]
    assert "train.sbatch: training stopped for the time limit (exit 75): requeue job 4242" in proc.stdout


def _cpu_job(tiny_model_dir, tmp_path) -> tuple:
    """(script, run folder, log, --set values) of the tiny training as a CPU site submits the
    script: the gres line taken out (no GPUs here); skips without a localhost SLURM."""
    reason = _slurm_ready()
    if reason:
        pytest.skip(reason)
    script = tmp_path / "train.sbatch"
    script.write_text(re.sub(r"(?m)^#SBATCH --gres=.*\n", "", SBATCH.read_text()))
    table = three_prompt_table(tmp_path / "train.parquet")
    sets = [f"model.path={tiny_model_dir}", f"data.train={table}", "sampling.num_steps=3",
            "sampling.resolution=32", "sampling.images_per_prompt=2", "sampling.batch_size=6",
            "sampling.num_batches_per_epoch=1", "train.batch_size=3"]
    return script, tmp_path / "run", tmp_path / "job.log", sets


@pytest.mark.slow
@pytest.mark.slurm
def test_sbatch_trains_the_tiny_model_on_one_node_of_the_localhost_slurm(tiny_model_dir, tmp_path):
    """The script as a CPU site would submit it: its #SBATCH geometry overridden on the command
    line (one node, one CPU, 2 GB, 20 min) and the gres line taken out (no GPUs here)."""
    script, run, log, sets = _cpu_job(tiny_model_dir, tmp_path)
    proc = subprocess.run(
        ["sbatch", "--wait", "--nodes=1", "--cpus-per-task=1", "--mem=2000", "--time=20",
         f"--output={log}", str(script), "--preset", "tiny", "--output-dir", str(run), "--no-progress",
         "--max-steps", "2", *[x for s in sets for x in ("--set", s)]],
        cwd=ROOT, env={**env(), "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=900)
    text = log.read_text() if log.exists() else ""
    assert proc.returncode == 0, f"{proc.stdout}{proc.stderr}\n{text[-4000:]}"
    assert "train.sbatch: " in text and "attempt 1" in text and "1 node(s) x 0 GPU(s)" in text
    assert "torchrun_slurm: task 0 of 1" in text, text[-3000:]
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["final_step"] == 2 and summary["world_size"] == 1


@pytest.mark.slow
@pytest.mark.slurm
def test_a_run_longer_than_the_time_limit_requeues_itself_and_finishes(tiny_model_dir, tmp_path):
    """A 2-min job (`--time=2`, USR1 60 s before the limit) for a training that cannot end
    in time on any machine (max_steps 10^6 in its config file): SLURM's own timer sends USR1
    (up to a minute early, possibly while the model loads), the attempt stops, exits 75 and
    requeues the job (same id). Once that attempt has stopped, the test lowers max_steps to 3
    past where it stopped (a result-neutral key, read by the next attempt) and gives the job
    30 min (`scontrol update TimeLimit`). The run then ends with every step once."""
    script, run, log, sets = _cpu_job(tiny_model_dir, tmp_path)
    sets.append("train.save_every=1000")
    steps_file = tmp_path / "steps.yaml"
    steps_file.write_text("train:\n  max_steps: 1000000\n")
    job = subprocess.Popen(
        ["sbatch", "--wait", "--parsable", "--nodes=1", "--cpus-per-task=1", "--mem=2000", "--time=2",
         "--signal=USR1@60", f"--output={log}", str(script), "--preset", "tiny", "--output-dir", str(run),
         "--no-progress", "--config", str(steps_file), *[x for s in sets for x in ("--set", s)]],
        cwd=ROOT, env={**env(), "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    job_id = None
    try:
        deadline = time.time() + 900  # readiness polling only; nothing is timed
        text = ""
        while "training stopped for the time limit" not in text and job.poll() is None:
            assert time.time() < deadline, "the first attempt never stopped"
            time.sleep(0.2)
            text = log.read_text() if log.exists() else ""
        stopped = re.search(r"SIGUSR1: stopped after step (\d+) ", text)
        assert stopped, text[-3000:]
        steps = int(stopped.group(1)) + 3
        steps_file.write_text(f"train:\n  max_steps: {steps}\n")  # before the requeued attempt loads
        job_id = re.search(r"train\.sbatch: \S+ job (\d+) attempt 1 ", text).group(1)
        while "attempt 2 " not in (log.read_text() if log.exists() else "") and job.poll() is None:
            assert time.time() < deadline, "no second attempt"
            time.sleep(0.2)
        subprocess.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=30"], check=True, timeout=60)
        out, _ = job.communicate(timeout=1800)
    finally:
        if job.poll() is None:
            job.kill()
            if job_id:
                subprocess.run(["scancel", job_id], check=False, timeout=60)
    text = log.read_text()
    print(text[-3000:])
    assert job.returncode == 0, f"{out}\n{text[-4000:]}"
    attempts = re.findall(r"train\.sbatch: \S+ job (\d+) attempt (\d+)", text)
    # SLURM may signal the second attempt too before its limit is raised: then a third resumes
    assert [int(a) for _, a in attempts] == list(range(1, len(attempts) + 1)) and len(attempts) >= 2, attempts
    assert {j for j, _ in attempts} == {job_id}, attempts
    # SLURM's timer, not the test, sent the signal: nothing here called scancel --signal.
    assert "torchrun_slurm: USR1 (time limit)" in text
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["final_step"] == steps
    if int(stopped.group(1)) > 0:  # a stop while the model loaded leaves no checkpoint
        assert summary["resumed_from"] and "with a checkpoint; exit 75" in text
    logged = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines() if line]
    assert logged == list(range(1, steps + 1))  # no step twice, none lost
