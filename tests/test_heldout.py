"""Held-out evaluation during training (marble.training.heldout): the pure parts against hand
calculations, then on the tiny SD3: it trains bitwise as a run without it, evaluates the
steps it should once each (a resume repeats none), and two balancers of one seed start from
the same evaluation (same prompts, same latents: the claim's paired comparison)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from checkpoint_compare import assert_same_checkpoint
from tiny_tables import three_prompt_table

from marble.train import main as train_main
from marble.training.checkpoint import checkpoint_dir
from marble.training.heldout import due, eval_record, heldout_items, heldout_rows


def test_rows_are_all_or_evenly_spaced():
    assert heldout_rows(5, None) == [0, 1, 2, 3, 4]
    assert heldout_rows(5, 9) == [0, 1, 2, 3, 4]
    assert heldout_rows(12, 4) == [0, 3, 6, 9]  # one per source of a table sorted by source
    assert heldout_rows(10, 3) == [0, 3, 6]


def test_items_are_dealt_round_robin_and_cover_every_pair_once():
    rows = [0, 3, 6]
    ranks = [heldout_items(rows, 2, r, 3) for r in range(3)]
    assert ranks[0] == [(0, 0), (3, 1)] and ranks[1] == [(0, 1), (6, 0)]
    assert sorted(x for r in ranks for x in r) == [(r, j) for r in rows for j in range(2)]


def test_due_at_step_zero_every_n_and_the_last_step():
    assert [s for s in range(8) if due(s, 3, 7)] == [0, 3, 6, 7]
    assert not any(due(s, 0, 7) for s in range(8))


def test_record_means_count_scored_and_unscorable_samples():
    # reward a: 3 scored summing to 1.5, 1 NaN; reward b: nothing applies
    totals = torch.tensor([[1.5, 0.0], [3.0, 0.0], [1.0, 0.0]], dtype=torch.float64)
    rec = eval_record(["a", "b"], totals)
    assert rec["eval_reward/a"] == 0.5 and rec["eval_applicable/a"] == 4 and rec["eval_nan/a"] == 1
    assert math.isnan(rec["eval_reward/b"]) and rec["eval_applicable/b"] == 0


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("data")
    return three_prompt_table(out / "train.parquet"), three_prompt_table(out / "test.parquet")


def _args(model: Path, tables, out: Path, steps: int, *extra: str) -> list[str]:
    sets = [f"model.path={model}", f"data.train={tables[0]}", f"data.test={tables[1]}",
            "sampling.num_steps=3", "sampling.eval_num_steps=3", "sampling.resolution=32",
            "sampling.images_per_prompt=2", "sampling.batch_size=6",
            "sampling.num_batches_per_epoch=1", "train.batch_size=3", "train.save_every=1",
            "balancer.amortize_every=2", *extra]
    return ["--preset", "tiny", "--output-dir", str(out), "--no-progress", "--max-steps",
            str(steps), *[x for s in sets for x in ("--set", s)]]


def _eval_lines(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]


EVAL = ("train.eval_every=2", "train.eval_images_per_prompt=2")


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tables, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("heldout")
    out = {"plain": root / "plain", "eval": root / "eval", "ws": root / "ws"}
    assert train_main(_args(tiny_model_dir, tables, out["plain"], 3)) == 0
    assert train_main(_args(tiny_model_dir, tables, out["eval"], 3, *EVAL)) == 0
    assert train_main(_args(tiny_model_dir, tables, out["ws"], 1, *EVAL,
                            "balancer.method=weighted_sum")) == 0
    return out


def _untimed(run: Path) -> list[dict]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in lines]


def test_training_with_evaluation_is_bitwise_training_without(runs):
    assert _untimed(runs["plain"]) == _untimed(runs["eval"])
    assert_same_checkpoint(checkpoint_dir(runs["plain"], 3), checkpoint_dir(runs["eval"], 3))
    assert not (runs["plain"] / "eval.jsonl").exists()


def test_steps_zero_every_n_and_last_each_once_with_every_reward(runs):
    lines = _eval_lines(runs["eval"])
    assert [r["step"] for r in lines] == [0, 2, 3]
    assert len({r["eval_id"] for r in lines}) == 1 and len(lines[0]["eval_id"]) == 16
    first = lines[0]
    # 3 prompts x 2 images; text contrast applies to one prompt, colour match to one
    assert first["eval_applicable/toy_brightness"] == 6 and first["eval_applicable/toy_text_contrast"] == 2
    assert first["eval_applicable/toy_color_match"] == 2 and first["eval_nan/toy_brightness"] == 0
    assert all(math.isfinite(first[f"eval_reward/{r}"]) for r in
               ("toy_brightness", "toy_saturation", "toy_text_contrast", "toy_color_match"))
    assert lines[-1]["eval_reward/toy_brightness"] != first["eval_reward/toy_brightness"]
    summary = json.loads((runs["eval"] / "train_summary.json").read_text())
    assert summary["cpu_time_s"] > 0  # the claim's cost column reads it (Snakemake's undercounts)
    assert summary["final_eval"] == {k: v for k, v in lines[-1].items() if k.startswith("eval_reward/")}


def test_two_balancers_of_one_seed_start_from_the_same_evaluation(runs):
    assert _score(_eval_lines(runs["ws"])[0]) == _score(_eval_lines(runs["eval"])[0])


def _score(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith("time/")}


def test_a_resume_repeats_no_evaluation_and_drops_those_past_the_checkpoint(runs, tiny_model_dir,
                                                                            tables, tmp_path):
    run = tmp_path / "run"
    assert train_main(_args(tiny_model_dir, tables, run, 2, *EVAL)) == 0
    # A kill after step 2's evaluation but before a later checkpoint: a line past it stays
    # behind in eval.jsonl (an evaluation of step 3 whose checkpoint never came).
    with open(run / "eval.jsonl", "a") as fh:
        fh.write(json.dumps({"step": 3, "eval_reward/toy_brightness": -1.0}) + "\n")
    assert train_main(_args(tiny_model_dir, tables, run, 3, *EVAL)) == 0
    got = _eval_lines(run)
    assert [r["step"] for r in got] == [0, 2, 3]
    assert [_score(r) for r in got] == [_score(r) for r in _eval_lines(runs["eval"])]


def test_a_missing_test_table_is_refused_before_training_when_evaluation_is_on(tables, tmp_path):
    from marble.config import load_config
    from marble.training.preflight import check_table
    from marble.training.run_dir import TrainError

    sets = [f"data.train={tables[0]}", f"data.test={tmp_path / 'none.parquet'}"]
    check_table(load_config("tiny", overrides=sets))  # no evaluation: the test table is not read
    with pytest.raises(TrainError) as err:
        check_table(load_config("tiny", overrides=[*sets, "train.eval_every=5"]))
    assert "`data.test`" in str(err.value) and "train.eval_every=0" in str(err.value)


def test_a_stop_during_an_evaluation_is_taken_with_a_checkpoint_of_that_step(
        tiny_model_dir, tables, tmp_path, monkeypatch):
    """SIGUSR1 while the held-out evaluation of step 2 runs (a paper one takes minutes): the
    run stops there with step 2's checkpoint (save_every 5 would not have written one), not
    one training step later, and the resume evaluates nothing twice."""
    import os
    import signal

    from marble.training import heldout

    real = heldout.HeldoutEvaluator.evaluate

    def evaluate_then_signal(self, step, ema):
        record = real(self, step, ema)
        if step == 2:
            os.kill(os.getpid(), signal.SIGUSR1)  # what SLURM's --signal sends
        return record

    monkeypatch.setattr(heldout.HeldoutEvaluator, "evaluate", evaluate_then_signal)
    run = tmp_path / "run"
    assert train_main(_args(tiny_model_dir, tables, run, 4, *EVAL, "train.save_every=5")) == 75
    assert checkpoint_dir(run, 2).is_dir() and not (run / "train_summary.json").exists()
    assert [r["step"] for r in _eval_lines(run)] == [0, 2]
    monkeypatch.setattr(heldout.HeldoutEvaluator, "evaluate", real)
    assert train_main(_args(tiny_model_dir, tables, run, 4, *EVAL, "train.save_every=5")) == 0
    assert [r["step"] for r in _eval_lines(run)] == [0, 2, 4]


def test_evaluation_settings_may_change_on_resume_and_the_change_says_it_is_none(
        runs, tiny_model_dir, tables, tmp_path):
    """The evaluation's settings do not change training, so a resume may change them; its
    lines then carry another eval_id, and the claim's change across them is NaN, not a
    difference of two measurements of different things."""
    import pandas as pd

    from marble.report.run_measures import eval_change

    run = tmp_path / "run"
    assert train_main(_args(tiny_model_dir, tables, run, 2, *EVAL)) == 0
    assert train_main(_args(tiny_model_dir, tables, run, 3, "train.eval_every=2",
                            "train.eval_images_per_prompt=1")) == 0
    lines = _eval_lines(run)
    assert [r["step"] for r in lines] == [0, 2, 3] and lines[0]["eval_id"] != lines[-1]["eval_id"]
    assert math.isnan(eval_change(pd.DataFrame(lines), "toy_brightness"))
    same = pd.DataFrame(_eval_lines(runs["eval"]))
    assert math.isfinite(eval_change(same, "toy_brightness", final_step=3))
