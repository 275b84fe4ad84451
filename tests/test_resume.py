"""Resume on the tiny SD3: a damaged newest checkpoint, a changed config, a USR1 stop.

One uninterrupted 4-step run (module fixture) is the reference every interrupted run
must reproduce bitwise, in every file of its checkpoints (EMA lora/, optimizer, state too).
Settings as in test_trainer: 32 px, 3 sampling steps, 6 rollouts.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from checkpoint_compare import assert_same_checkpoint
from tiny_tables import three_prompt_table

from marble.training.run_lock import lock_path
from marble.data.records import PromptRecord, to_frame
from marble.train import main as train_main
from marble.training.checkpoint import checkpoint_dir, damaged_files
from marble.training.stopping import EXIT_REQUEUE, REQUEUE_FILE_ENV

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def table_path(tmp_path_factory) -> Path:
    return three_prompt_table(tmp_path_factory.mktemp("data") / "train.parquet")


def args(model: Path, table: Path, out: Path, max_steps: int, *extra: str) -> list[str]:
    sets = [f"model.path={model}", f"data.train={table}", "sampling.num_steps=3",
            "sampling.resolution=32", "sampling.images_per_prompt=2", "sampling.batch_size=6",
            "sampling.num_batches_per_epoch=1", "train.batch_size=3", "train.save_every=1",
            "balancer.amortize_every=2", *extra]
    return ["--preset", "tiny", "--output-dir", str(out), "--no-progress",
            "--max-steps", str(max_steps), *[x for s in sets for x in ("--set", s)]]


@pytest.fixture(scope="module")
def straight(tiny_model_dir, table_path, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("straight") / "run"
    assert train_main(args(tiny_model_dir, table_path, run, 4)) == 0
    return run


def test_truncated_newest_checkpoint_falls_back_to_the_previous(
        straight, tiny_model_dir, table_path, tmp_path, caplog):
    run = tmp_path / "run"
    assert train_main(args(tiny_model_dir, table_path, run, 3)) == 0
    damaged = checkpoint_dir(run, 3) / "adapters.safetensors"
    damaged.write_bytes(damaged.read_bytes()[:100])  # COMPLETE marker still there
    with caplog.at_level(logging.WARNING):
        assert train_main(args(tiny_model_dir, table_path, run, 4)) == 0
    assert "checkpoint-000003" in caplog.text and "adapters.safetensors" in caplog.text
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["resumed_from"].endswith("checkpoint-000002")
    assert damaged_files(checkpoint_dir(run, 3)) == []  # rewritten by the resumed run
    assert_same_checkpoint(checkpoint_dir(straight, 4), checkpoint_dir(run, 4))


def test_resume_with_a_changed_training_key_fails_naming_it(straight, tiny_model_dir,
                                                             table_path, capsys):
    saved = (straight / "config.yaml").read_text()
    with pytest.raises(SystemExit) as exc:
        train_main(args(tiny_model_dir, table_path, straight, 6, "train.kl_beta=0.5",
                        "train.log_every=2"))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "train.kl_beta: 0.0001 in the run folder, 0.5 requested" in err
    assert "train.log_every:" not in err and "train.max_steps:" not in err  # may change
    assert (straight / "config.yaml").read_text() == saved
    # The library entry point refuses too, before it touches the folder.
    from marble.train import build_parser, resolve_config
    from marble.training.run_dir import TrainError
    from marble.training.run import run_training

    cfg = resolve_config(build_parser().parse_args(
        args(tiny_model_dir, table_path, straight, 4, "balancer.alpha_ema=0.5")))
    with pytest.raises(TrainError, match="balancer.alpha_ema: 0.7 in the run folder, 0.5"):
        run_training(cfg, straight)
    assert (straight / "config.yaml").read_text() == saved


def test_usr1_checkpoints_the_current_step_and_the_rerun_resumes(
        straight, tiny_model_dir, table_path, tmp_path):
    run, flag = tmp_path / "run", tmp_path / "requeue-flag"
    # The same intra-op thread count as this process: CPU float sums depend on it.
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads()),
           REQUEUE_FILE_ENV: str(flag),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    # save_every 100: the only checkpoint before the end is the one the signal asks for.
    cmd = [sys.executable, "-m", "marble", "train",
           *args(tiny_model_dir, table_path, run, 8, "train.save_every=100")]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    metrics = run / "metrics.jsonl"
    for _ in range(6000):  # poll until step 1 is logged (readiness only, nothing timed)
        if proc.poll() is not None or (metrics.is_file() and metrics.read_text().strip()):
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == EXIT_REQUEUE, err[-3000:]
    steps = [json.loads(x)["step"] for x in metrics.read_text().splitlines() if x]
    stopped = steps[-1]
    assert 1 <= stopped < 4, steps
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert ckpts == [f"checkpoint-{stopped:06d}"]
    assert damaged_files(checkpoint_dir(run, stopped)) == []
    assert not (run / "train_summary.json").exists()  # the workflow must not see "done"
    assert flag.read_text() == f"step {stopped} SIGUSR1 with a checkpoint\n"
    assert "SIGUSR1" in err and f"exit {EXIT_REQUEUE}" in err
    # The requeued job resumes from the signal's checkpoint; one more step equals the
    # uninterrupted run's (which keeps checkpoints 2-4).
    assert train_main(args(tiny_model_dir, table_path, run, stopped + 1)) == 0
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["resumed_from"].endswith(f"checkpoint-{stopped:06d}")
    assert_same_checkpoint(checkpoint_dir(straight, stopped + 1), checkpoint_dir(run, stopped + 1))


def test_second_trainer_is_refused_and_usr1_during_loading_exits_75(
        tiny_model_dir, table_path, tmp_path, capsys):
    """Two `marble train` on one folder: the second is refused while the first lives (the
    orphaned-trainer case: its lock names a live pid). A SIGUSR1 that reaches the first
    while it loads (after the lock, before any step) ends it with 75, not a kill."""
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("SLURM_JOB_ID", None)
    cmd = [sys.executable, "-m", "marble", "train", *args(tiny_model_dir, table_path, run, 4)]
    first = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    lock = lock_path(run)  # outside the run folder (marble.training.run_lock)
    for _ in range(6000):  # readiness polling only
        if first.poll() is not None or lock.is_file():
            break
        time.sleep(0.01)
    assert json.loads(lock.read_text())["pid"] == first.pid
    with pytest.raises(SystemExit) as exc:
        train_main(args(tiny_model_dir, table_path, run, 4))
    assert exc.value.code == 2
    assert f"being trained by pid {first.pid}" in capsys.readouterr().err
    # The first trainer holds the lock and is loading (config.yaml is written only once the
    # model, table and rewards loaded: marble.training.preflight): stop it now.
    assert first.poll() is None
    first.send_signal(signal.SIGUSR1)
    _, err = first.communicate(timeout=600)
    assert first.returncode == EXIT_REQUEUE, err[-3000:]
    assert not (run / "metrics.jsonl").is_file() or not (run / "metrics.jsonl").read_text().strip()
    assert not (run / "train_summary.json").exists() and not lock.exists()


def test_fresh_keeps_the_old_run_aside_and_starts_over(tiny_model_dir, table_path, tmp_path, capsys):
    """A changed input is refused, naming `--fresh`; `--fresh` with an input that fails its
    check moves nothing; `--fresh` then renames the old run aside (every file as it was)
    and trains anew, recording the new input."""
    from marble.training.checkpoint_format import file_hashes
    from marble.training.inputs import INPUTS_FILE

    table = tmp_path / "train.parquet"
    table.write_bytes(table_path.read_bytes())
    run = tmp_path / "runs" / "marble"
    assert train_main(args(tiny_model_dir, table, run, 1)) == 0
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    rows = [PromptRecord.make("a lighthouse at night", "pickscore"),
            PromptRecord.make('a sign that says "bye"', "ocr"),
            PromptRecord.make("a photo of a blue cup", "geneval",
                              {"tag": "color_attr", "include": [{"class": "cup", "count": 1, "color": "blue"}]})]
    to_frame(rows, {"toy_brightness": [True] * 3, "toy_saturation": [True] * 3,
                    "toy_text_contrast": [False, True, False],
                    "toy_color_match": [False, False, True]}).to_parquet(table)  # same path
    capsys.readouterr()
    with pytest.raises(SystemExit):
        train_main(args(tiny_model_dir, table, run, 1))
    assert "data.train" in (err := capsys.readouterr().err) and "--fresh" in err, err
    with pytest.raises(SystemExit):  # an input that fails its check: nothing is moved
        train_main(args(tiny_model_dir, table, run, 1, "rewards=[{name: toy_nope}]") + ["--fresh"])
    assert "toy_nope" in capsys.readouterr().err and run.is_dir()
    assert not [p for p in run.parent.iterdir() if ".replaced-" in p.name]
    assert train_main(args(tiny_model_dir, table, run, 1) + ["--fresh"]) == 0
    [aside] = [p for p in run.parent.iterdir() if p.name.startswith(".marble.replaced-")]
    assert f"kept as {aside}" in capsys.readouterr().out
    assert {p.relative_to(aside): p.read_bytes() for p in aside.rglob("*") if p.is_file()} == before
    new = json.loads((run / INPUTS_FILE).read_text())["data.train"]["fingerprint"]
    old = json.loads((aside / INPUTS_FILE).read_text())["data.train"]["fingerprint"]
    assert new != old and json.loads((run / "train_summary.json").read_text())["resumed_from"] is None
    assert file_hashes(checkpoint_dir(run, 1)) != file_hashes(checkpoint_dir(aside, 1))


# The tiny curriculum (preset tiny_sequential) shrunk to stages of 2, 1 and 2 steps: boundaries
# after steps 2 and 3; one prompt per sampling batch, since the table has one row per source. The
# last stage has its own balancer (MARBLE: an alpha cache that resume must put back into that
# stage's balancer) and learning rate.
STAGED = ["sampling.batch_size=2", "train.batch_size=2", "train.keep_checkpoints=0",
          ("stages=[{name: pickscore, steps: 2, sources: [pickscore],"
           " rewards: [toy_brightness, toy_saturation]},"
           " {name: geneval, steps: 1, sources: [geneval], rewards: [toy_color_match]},"
           " {name: ocr, steps: 2, sources: [ocr], rewards: [toy_text_contrast, toy_brightness],"
           " balancer: {method: marble}, lr: 5.0e-3}]")]


def staged_args(model: Path, table: Path, out: Path, max_steps: int) -> list[str]:
    argv = args(model, table, out, max_steps, *STAGED)
    argv[argv.index("tiny")] = "tiny_sequential"
    return argv


def simulate_kill(run: Path, step: int) -> None:
    """What a kill -9 during step `step` + 1 leaves beside checkpoint `step`: the step's
    metrics line, a torn line after it, and a half-written checkpoint folder."""
    with (run / "metrics.jsonl").open("a", encoding="utf-8") as f:
        f.write(json.dumps({"step": step + 1, "stage": -1}) + '\n{"step": ')
    tmp = run / "checkpoints" / f".checkpoint-{step + 1:06d}.killed.tmp"
    tmp.mkdir()
    (tmp / "state.pt").write_bytes(b"half")


@pytest.mark.filterwarnings("ignore:.*torn last line")  # simulate_kill's, on purpose
def test_staged_resume_across_every_boundary_is_bitwise(tiny_model_dir, table_path, tmp_path):
    """Straight 5 steps against a run killed after every step 1..4, i.e. one step before, at
    and one after each boundary (2, 3); every file of every checkpoint (EMA lora/, optimizer,
    adapters, state with balancer, sampler and stage) is bitwise the straight run's."""
    straight, chain = tmp_path / "straight", tmp_path / "chain"
    assert train_main(staged_args(tiny_model_dir, table_path, straight, 5)) == 0
    for step in range(1, 6):
        if step > 1:
            simulate_kill(chain, step - 1)
        assert train_main(staged_args(tiny_model_dir, table_path, chain, step)) == 0
    for step in range(1, 6):
        assert_same_checkpoint(checkpoint_dir(straight, step), checkpoint_dir(chain, step))
    state = torch.load(checkpoint_dir(chain, 3) / "state.pt", weights_only=True)
    # Checkpoint 3 ends stage 1 (geneval): its balancer; step 4 starts stage 2 (ocr).
    assert state["stage"] == {"index": 1, "name": "geneval", "start_step": 2, "steps": 1}
    records = [json.loads(x) for x in (chain / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["stage_name"]) for r in records] == [
        (1, "pickscore"), (2, "pickscore"), (3, "geneval"), (4, "ocr"), (5, "ocr")]
    # Each stage scores only its own rewards; the optimizer's moments span the boundaries.
    assert "reward/toy_color_match" in records[2] and "reward/toy_brightness" not in records[2]
    # Step 5 applies the alpha cache that checkpoint 4 carried into the ocr stage's MARBLE.
    assert records[3]["full_solve"] == 1.0 and records[4]["full_solve"] == 0.0
    assert records[4]["balancer"] == "marble" and "alpha/toy_brightness" in records[4]


def test_a_later_stage_without_rows_fails_before_the_first_step(
        tiny_model_dir, table_path, tmp_path, capsys):
    """Stage b is never reached in a 1-step run; its missing source still fails at start, in one
    line naming the stage, not at its boundary hours into a long run."""
    run = tmp_path / "run"
    argv = args(tiny_model_dir, table_path, run, 1, "sampling.batch_size=2", "train.batch_size=2",
                ("stages=[{name: a, steps: 1, sources: [pickscore], rewards: [toy_brightness]},"
                 " {name: b, steps: 1, sources: [drawbench], rewards: [toy_brightness]}]"))
    argv[argv.index("tiny")] = "tiny_sequential"
    with pytest.raises(SystemExit) as exc:
        train_main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "stage 'b': `stages[1].sources` ['drawbench'] have no rows" in err and err.count("\n") == 1
    assert not (run / "checkpoints").exists()
