"""Live trackers (logging.backends): rank 0 only, a failing tracker warns and training
goes on, DVCLive curves that `dvc plots` reads, and the typed config key."""

from __future__ import annotations

import json
import math
import warnings

import pytest

from marble.config import ConfigError, load_config
from marble.training.metrics import MetricsLog
from marble.training.trackers import TrackerFanout, open_trackers, scalars


class Recorder:
    """A tracker with the real interface that keeps what it was sent."""

    name = "recorder"

    def __init__(self, out_dir, run_name):
        self.out_dir, self.run_name, self.calls, self.closed = out_dir, run_name, [], False

    def log(self, scalars, step):
        self.calls.append((step, dict(scalars)))

    def close(self):
        self.closed = True


class Broken(Recorder):
    name = "broken"

    def log(self, scalars, step):
        raise OSError("disk full")


def _refuses(out_dir, run_name):
    raise ImportError("No module named 'wandb'")


def test_scalars_keep_finite_numbers_only():
    record = {"step": 3, "reward/a": 0.5, "reward/b": math.nan, "balancer": "marble",
              "full_solve": True, "alpha": [0.5, 0.5], "loss": 2}
    assert scalars(record) == {"reward/a": 0.5, "full_solve": 1.0, "loss": 2.0}


def test_a_tracker_that_fails_to_start_warns_and_the_rest_run(tmp_path):
    factories = {"wandb": _refuses, "tensorboard": Recorder}
    with pytest.warns(UserWarning, match="tracker wandb did not start.*No module named 'wandb'"):
        trackers = open_trackers(["jsonl", "wandb", "tensorboard"], tmp_path / "run", factories=factories)
    assert [type(t) for t in trackers] == [Recorder] and trackers[0].run_name == "run"
    with pytest.raises(ValueError, match="unknown backend 'mlflow'"):
        open_trackers(["mlflow"], tmp_path, factories=factories)


def test_a_tracker_that_fails_later_is_dropped(tmp_path):
    good, bad = Recorder(tmp_path, "r"), Broken(tmp_path, "r")
    fan = TrackerFanout([bad, good])
    with pytest.warns(UserWarning, match="tracker broken failed.*disk full"):
        fan.log({"step": 1, "reward/a": 0.25})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fan.log({"step": 2, "reward/a": 0.5})
    assert good.calls == [(1, {"reward/a": 0.25}), (2, {"reward/a": 0.5})]
    fan.close()
    assert good.closed


def test_missing_tracker_package_leaves_jsonl_intact(tmp_path, monkeypatch):
    """wandb is not installed here: the run still writes every step to metrics.jsonl."""
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    log = MetricsLog(tmp_path / "metrics.jsonl", backends=["jsonl", "wandb"])
    with pytest.warns(UserWarning, match="tracker wandb did not start"):
        log.log({"step": 1, "reward/a": 0.5})
    log.log({"step": 2, "reward/a": 0.75})
    assert [r["step"] for r in log.read()] == [1, 2]


def test_dvclive_curves_on_rank0_only(tmp_path):
    pytest.importorskip("dvclive")
    main = MetricsLog(tmp_path / "main/metrics.jsonl", backends=["jsonl", "dvclive"])
    for step, value in [(1, 0.25), (2, math.nan), (3, 0.75)]:
        main.log({"step": step, "reward/toy_brightness": value, "balancer": "marble"})
    main.close()
    tsv = (tmp_path / "main/dvclive/plots/metrics/reward/toy_brightness.tsv").read_text().splitlines()
    assert tsv[0].split("\t") == ["step", "toy_brightness"]
    assert [line.split("\t")[0] for line in tsv[1:]] == ["1", "3"]  # NaN left out, not 0
    summary = json.loads((tmp_path / "main/dvclive/metrics.json").read_text())
    assert summary["reward"]["toy_brightness"] == 0.75
    other = MetricsLog(tmp_path / "rank1/metrics.jsonl", enabled=False, backends=["dvclive"])
    other.log({"step": 1, "reward/toy_brightness": 0.5})
    assert not (tmp_path / "rank1").exists()


def test_logging_backends_is_a_typed_config_key():
    cfg = load_config("tiny", overrides=['logging.backends=["jsonl", "dvclive"]'])
    assert cfg.logging.backends == ["jsonl", "dvclive"]
    assert load_config("tiny").logging.backends == ["jsonl"]
    with pytest.raises(ConfigError, match="logging.backends"):
        load_config("tiny", overrides=['logging.backends=["mlflow"]'])
    with pytest.raises(ConfigError, match="logging.backend"):
        load_config("tiny", overrides=["logging.backend=[jsonl]"])


def test_trackers_do_not_block_a_resume():
    """A run folder written before logging.backends existed (or with other trackers)
    resumes: watching a run does not change its result."""
    from marble.config import to_dict
    from marble.training.run_dir import config_differences

    wanted = to_dict(load_config("tiny", overrides=['logging.backends=["jsonl", "dvclive"]']))
    saved = {k: v for k, v in to_dict(load_config("tiny")).items() if k != "logging"}
    assert config_differences(saved, wanted) == []


_WANDB_ID = """
import sys, types
from pathlib import Path
fake = types.ModuleType("wandb")  # wandb.init's keywords as the tracker passes them
fake.init = lambda *, project=None, name=None, dir=None, id=None, resume=None, **settings: id
sys.modules["wandb"] = fake
from marble.training.trackers import WandbTracker
print(WandbTracker(Path(sys.argv[1]), "run").run)
"""


def test_the_wandb_run_id_is_the_same_in_every_process(tmp_path):
    """A requeued job is a new process: it must resume the same W&B run, so the id cannot
    depend on the process's string-hash salt."""
    import os
    import subprocess
    import sys

    ids = {subprocess.run([sys.executable, "-c", _WANDB_ID, str(tmp_path)], check=True, text=True,
                          capture_output=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout.strip()
           for seed in ("1", "2")}
    assert len(ids) == 1 and next(iter(ids)).startswith("run-"), ids
