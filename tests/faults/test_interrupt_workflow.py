"""Fault: interrupting Snakemake itself and `dvc repro` (issue 32).

One training run (3 steps, a checkpoint each) and its evaluation, the CI workflow shrunk,
run as `snakemake -c2 evaluate` and as `dvc repro evaluate`. Each is struck at seeded
moments one after another (during the training, during the evaluation, the instant a job's
output appears, while Snakemake records it): Ctrl-C once and twice, SIGTERM, kill -9; after
each, the same command runs again, and where it refuses, it must name what to run (the
test then runs that, as a user would). At the end the outputs must equal an uninterrupted
run's: every checkpoint file bit for bit, the metrics step by step, the evaluation's rows,
averages and images. After Ctrl-C or SIGTERM no Snakemake lock and no process may be left.

The inputs are prepared once for both (`snakemake prepare`; the session's tiny pipeline
lends its model and tables when the session builds it anyway); the uninterrupted reference
runs the two jobs' own commands, read from Snakemake's dry run, in this process with the
thread counts Snakemake gives them. MARBLE_FAULT_SEED draws the moments.
"""

from __future__ import annotations

import os
import random
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from test_workflow_lib import BIN, copy_inputs, copy_workflow, dvc, init_dvc, snakemake
from test_workflow_lib import tiny_pipeline  # noqa: F401  (a fixture, used when the session builds it)

from .interrupts import Moment, Outcome, interrupt, remedy, run
from .test_kill_evaluation import differences, outcome
from .test_kill_training import checkpoint_contents, metric_rows

SEED = int(os.environ.get("MARBLE_FAULT_SEED", "21"))
STEPS = 3
TARGET = "evaluate"
RUN = "results/runs/marble"
EVAL = "results/eval/*/marble/*/pickscore"
SNAKEMAKE = [str(BIN / "snakemake"), "-c2", TARGET]
DVC = [str(BIN / "dvc"), "repro", TARGET]


def _session_builds_the_tiny_pipeline(request) -> bool:
    return any("tiny_pipeline" in getattr(item, "fixturenames", ()) for item in request.session.items)


def job_commands(work: Path) -> dict[str, tuple[list[str], int]]:
    """{"train" | "evaluate": (marble's arguments, threads)} of the target's two jobs, as
    Snakemake's dry run prints them."""
    # With the real run's -c2: a dry run without it plans every job at 1 thread, and the
    # training then ran at 2 against a 1-thread reference (equal on an Intel Xeon, not on an
    # AMD EPYC).
    proc = snakemake(["-n", "-p", *SNAKEMAKE[1:]], work)
    jobs, threads = {}, 1
    for line in (proc.stdout + proc.stderr).splitlines():
        text = line.strip()
        if text.startswith(("rule ", "localrule ")):
            threads = 1
        elif text.startswith("threads:"):
            threads = int(text.split()[1])
        elif text.startswith("Shell command:"):
            words = shlex.split(text.removeprefix("Shell command:").split(">>")[0])
            launch = [i for i, w in enumerate(words) if w.endswith("/train_launch.sh")]
            if launch:
                at = words.index("--", launch[0])
                jobs["train"] = (words[at + 1:], threads)
            elif "marble" in words and "evaluate" in words:
                jobs["evaluate"] = (words[words.index("evaluate") + 1:], threads)
    assert set(jobs) == {"train", "evaluate"}, proc.stdout[-3000:]
    return jobs


def _with(args: list[str], flag: str, value: str) -> list[str]:
    at = args.index(flag)
    return [*args[:at + 1], value, *args[at + 2:]]


# Snakemake's shell gives each job these variables, set to its `threads` (snakemake/shell.py).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def uninterrupted(work: Path, jobs: dict, out: Path) -> dict:
    """The two jobs run from `work` into `out`, each in its own process with the thread
    variables Snakemake's shell sets: the reference. Not in this process: a thread pool sized
    after torch started is not the one the job gets, and on an AMD EPYC the float sums of the
    same step can differ in their 8th digit."""
    run_dir, eval_dir = out / "run", out / "eval"
    train_args = _with(jobs["train"][0], "--output-dir", str(run_dir))
    eval_args = jobs["evaluate"][0]
    checkpoint = Path(eval_args[eval_args.index("--checkpoint_path") + 1]).name
    eval_args = _with(_with(eval_args, "--output_dir", str(eval_dir)), "--checkpoint_path",
                      str(run_dir / "checkpoints" / checkpoint))
    for cmd, (_, threads) in (([str(BIN / "marble"), "train", *train_args], jobs["train"]),
                              ([str(BIN / "marble"), "evaluate", *eval_args], jobs["evaluate"])):
        env = {**os.environ, **{name: str(threads) for name in THREAD_VARIABLES}}
        proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return {"checkpoints": checkpoint_contents(run_dir), "metrics": metric_rows(run_dir),
            "eval": outcome(eval_dir)}


@pytest.fixture(scope="module")
def project(request, tmp_path_factory) -> dict:
    start = time.perf_counter()
    base = copy_workflow(tmp_path_factory.mktemp("interrupts") / "base")
    cfg = yaml.safe_load((base / "config.yaml").read_text())
    cfg["runs"] = {"marble": {"preset": "tiny", "max_steps": STEPS,
                              "set": ["train.save_every=1", "train.keep_checkpoints=0"]}}
    cfg["eval"].update(datasets=["pickscore"], limit=2, num_inference_steps=2)
    (base / "config.yaml").write_text(yaml.safe_dump(cfg))
    if _session_builds_the_tiny_pipeline(request):
        copy_inputs(request.getfixturevalue("tiny_pipeline")["dir"], base,
                    ["data/models", "data/raw-tiny", "data/datasets"])
    snakemake(["-c2", "prepare"], base)
    prepared = time.perf_counter()
    reference = uninterrupted(base, job_commands(base), tmp_path_factory.mktemp("reference"))
    print(f"\n[bench] interrupts: prepare {prepared - start:.1f} s, "
          f"uninterrupted reference {time.perf_counter() - prepared:.1f} s")
    return {"base": base, "reference": reference}


def workdir(project: dict, tmp_path: Path) -> Path:
    work = tmp_path / "work"
    shutil.copytree(project["base"], work, symlinks=True)
    return work


def same_as_uninterrupted(work: Path, reference: dict) -> list[str]:
    run_dir = work / RUN
    problems = []
    contents = checkpoint_contents(run_dir)
    for name in sorted(set(reference["checkpoints"]) | set(contents)):
        ref, got = reference["checkpoints"].get(name, {}), contents.get(name, {})
        differ = sorted(f for f in set(ref) | set(got) if got.get(f) != ref.get(f))
        if differ:
            problems.append(f"{name}: {', '.join(differ)} differ from the uninterrupted run")
    if metric_rows(run_dir) != reference["metrics"]:
        problems.append(f"metrics.jsonl differs (steps {[r.get('step') for r in metric_rows(run_dir)]})")
    evaluated = sorted(work.glob(EVAL))
    if len(evaluated) != 1:
        return [*problems, f"{len(evaluated)} evaluation folders"]
    problems += [f"evaluation: {p}" for p in differences(reference["eval"], outcome(evaluated[0]))]
    return problems


def our_tracebacks(output: str, work: Path) -> list[str]:
    """Tracebacks with a frame in marble's code (the copy in `work`, or the installed one);
    Snakemake prints its own on a second Ctrl-C: not ours to fix."""
    ours = (f"{work / 'marble'}/", f"{Path(__file__).resolve().parents[2] / 'marble'}/")
    return [t for t in output.split("Traceback")[1:]
            if any(f.startswith(ours) for f in re.findall(r'File "([^"]+)"', t))]


def interrupted(seen: Outcome, work: Path, orphans_ok: bool = False, lock_ok: bool = False) -> list[str]:
    """What an interrupt left that it should not have. `orphans_ok`: the signal could not
    reach the jobs (kill -9 of one process, or of DVC, which returns before its stage's
    Snakemake ends); `lock_ok`: Snakemake itself was SIGKILLed, so the rerun must name
    the way out."""
    problems = []
    if seen.missed:
        problems.append(f"the command ended (exit {seen.code}) before the moment came")
    elif seen.code == 0:
        problems.append("exit status 0 after an interrupt")
    if seen.locks and not lock_ok:
        problems.append(f"Snakemake's lock left: .snakemake/locks/{', '.join(seen.locks)}")
    if seen.orphans and not orphans_ok:
        problems.append(f"still running after the command ended: {seen.orphans}")
    if seen.left:
        problems.append(f"never ended: {seen.left}")
    ours = our_tracebacks(seen.output, work)
    if ours:
        problems.append("a traceback: " + ours[0][-300:])
    return problems


class User:
    """Runs one command again and again, as a user at a terminal: where it refuses, does
    what the refusal names (`remedy`), and keeps a flag it was told to add."""

    def __init__(self, work: Path, cmd: list[str], logs: Path):
        self.work, self.cmd, self.logs = work, list(cmd), logs
        self.flags_ok = Path(cmd[0]).name == "snakemake"
        self.told: list[str] = []

    def follow(self, said: str) -> bool:
        """Do what `said` tells; False when it names nothing (or the same thing again)."""
        step = remedy(said, self.flags_ok)
        if step is None or (step.startswith("--") and step in self.cmd):
            return False
        self.told.append(step)
        if step.startswith("--"):
            self.cmd.append(step)
        else:
            unlock = run(self.work, [str(BIN / "snakemake"), "--unlock"],
                         self.logs / f"unlock{len(self.told)}.log")
            assert unlock.returncode == 0, unlock.stderr[-1000:]
        return True

    def strike(self, i: int, moment: Moment, hits: list) -> Outcome:
        for attempt in range(3):
            seen = interrupt(self.work, self.cmd, moment, hits, self.logs / f"strike{i}.{attempt}.log")
            if not (seen.missed and seen.code and self.follow(seen.output)):
                return seen
        return seen

    def finish(self) -> list[str]:
        for attempt in range(4):
            proc = run(self.work, self.cmd, self.logs / f"rerun{attempt}.log")
            if proc.returncode == 0:
                return []
            if not self.follow(proc.stdout + proc.stderr):
                return [f"the rerun exited {proc.returncode} naming no remedy: {proc.stderr[-600:]}"]
        return ["still refused after doing what the messages said"]


def regenerated(struck: set[tuple]) -> list[str]:
    """Each output found at the crash must have been written again: Snakemake cannot know
    it was complete (its incomplete marker), so taking it as done would be a guess."""
    kept = []
    for path, ino, mtime in struck:
        st = os.stat(path) if os.path.exists(path) else None
        if st is not None and (st.st_ino, st.st_mtime_ns) == (ino, mtime):
            kept.append(Path(path).name)
    return [f"{name}, found at the crash, was taken as done" for name in sorted(kept)]


def record(fault_trials, records: list[list], final: list[str]) -> None:
    """Each strike held when it left nothing wrong and the end equals the reference (a
    difference at the end is charged to every strike: any could have caused it)."""
    for what, problems in records:
        problems = problems + final
        fault_trials.record(not problems, f"{what}: {'; '.join(problems) or 'held'}")


def training(delay: float, nth: int = 1) -> Moment:
    """The `nth` checkpoint this command writes, plus `delay`."""
    return Moment(f"training, checkpoint {nth}", (f"{RUN}/checkpoints/checkpoint-*/COMPLETE",),
                  delay, nth)


EVALUATING = (f"{EVAL}/provenance.json",)  # written as the evaluation starts its samples
# The instant a job's output appears: its process is ending, Snakemake has not recorded it.
RECORDING_EVAL = (f"{EVAL}/average_scores.json", "results/eval/summary.csv")


def chain(user: User, strikes: list) -> tuple[list[list], set[tuple]]:
    """[what, problems] per (what, moment, hits, orphans_ok, lock_ok); the files the last
    strike found."""
    records, seen = [], None
    for i, (what, moment, hits, orphans_ok, lock_ok) in enumerate(strikes):
        told = len(user.told)
        seen = user.strike(i, moment, hits)
        label = f"{what} (+{moment.delay:.2f} s)"
        if user.told[told:]:
            label += f" [before it: {', '.join(user.told[told:])}]"
        records.append([label, interrupted(seen, user.work, orphans_ok=orphans_ok, lock_ok=lock_ok)])
    return records, seen.struck


@pytest.mark.slow
@pytest.mark.fault("Snakemake interrupted (Ctrl-C, twice, SIGTERM, kill -9), then rerun")
def test_snakemake_interrupted_then_rerun(project, tmp_path, fault_trials):
    rng = random.Random(SEED)
    work = workdir(project, tmp_path)
    start = time.perf_counter()
    user = User(work, SNAKEMAKE, tmp_path)
    records, struck = chain(user, [
        ("Ctrl-C during training", training(rng.uniform(0, 1), rng.randint(1, STEPS - 1)),
         [("Ctrl-C", 0)], False, False),
        # Snakemake's SIGTERM: no new job, the running one finishes (our training is not
        # signalled), then it stops.
        ("kill PID (SIGTERM) of Snakemake during training", training(rng.uniform(0, 1)),
         [("kill PID", 0)], False, False),
        # The second Ctrl-C makes Snakemake quit without waiting for its job, which has both
        # signals and ends on its own (it must: nothing may be left running).
        ("Ctrl-C twice during the evaluation", Moment("evaluating", EVALUATING, rng.uniform(0, 1)),
         [("Ctrl-C", rng.uniform(0.05, 0.5)), ("Ctrl-C", 0)], True, False),
        ("kill -9 (all) as Snakemake records a job", Moment("recording", RECORDING_EVAL),
         [("kill -9 the group", 0)], False, True),
    ])
    if not (work / RUN / "train_summary.json").is_file():
        records[1][1].append("Snakemake's SIGTERM did not let the running training finish")
    records[-1][1] += user.finish() + regenerated(struck)
    record(fault_trials, records, same_as_uninterrupted(work, project["reference"]))
    print(f"\n[bench] interrupts: the snakemake chain took {time.perf_counter() - start:.1f} s; "
          f"the user was told: {', '.join(user.told) or 'nothing'}")
    assert not fault_trials.lost, fault_trials.lost


@pytest.mark.slow
@pytest.mark.fault("dvc repro interrupted (Ctrl-C, kill -9, SIGTERM), then rerun")
def test_dvc_repro_interrupted_then_rerun(project, tmp_path, fault_trials):
    rng = random.Random(SEED + 1)
    work = workdir(project, tmp_path)
    init_dvc(work)
    dvc(["commit", "--force", "prepare"], work)  # prepared once: DVC records it, no rerun
    start = time.perf_counter()
    user = User(work, DVC, tmp_path)
    records, _ = chain(user, [
        ("Ctrl-C during training", training(rng.uniform(0, 1), rng.randint(1, STEPS - 1)),
         [("Ctrl-C", 0)], False, False),
        # DVC dies at once; the stage's wrapper (dvc_sync) sees it and stops Snakemake as
        # Ctrl-C would, instead of leaving it to run headless beside the next `dvc repro`.
        ("kill -9 PID of dvc as Snakemake records the training",
         Moment("recording", (f"{RUN}/train_summary.json",)), [("kill -9 PID", 0)], True, False),
        # As systemd, SLURM or a container stop do: every process of the job gets it; DVC
        # ends at once, Snakemake (its own process group: dvc_sync passes it on) once its
        # job has stopped.
        ("SIGTERM to every process during the evaluation",
         Moment("evaluating", EVALUATING, rng.uniform(0, 1)), [("SIGTERM to the group", 0)],
         True, False),
    ])
    record(fault_trials, records, user.finish() + same_as_uninterrupted(work, project["reference"]))
    print(f"\n[bench] interrupts: the dvc repro chain took {time.perf_counter() - start:.1f} s; "
          f"the user was told: {', '.join(user.told) or 'nothing'}")
    assert not fault_trials.lost, fault_trials.lost
