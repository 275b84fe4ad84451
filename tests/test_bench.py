"""`marble bench step` on the tiny model: the JSON schema, positive numbers, ratios."""

from __future__ import annotations

import json

import pytest

from marble.bench import main as bench_main
from marble.config import load_config


def test_bench_step_writes_schema(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "bench.json"
    argv = ["step", "--preset", "tiny", "--json", str(out), "--repeats", "2", "--warmup", "1",
            "--model", str(tiny_model_dir), "--set", "sampling.resolution=32",
            "--set", "train.batch_size=3"]
    assert bench_main(argv) == 0
    res = json.loads(out.read_text())
    assert set(res["balancers"]) == {"weighted_sum", "marble", "mgda"}
    for name, r in res["balancers"].items():
        assert r["step_s"] > 0, name
        assert r["peak_mb"] >= 0, name
        assert len(r["step_s_all"]) == 2
    assert set(res["ratios"]) == {"marble", "mgda"}
    for name, r in res["ratios"].items():
        ws, this = res["balancers"]["weighted_sum"], res["balancers"][name]
        assert r["time"] == pytest.approx(this["step_s"] / ws["step_s"])
        assert r["time"] > 0
    assert res["memory_kind"].startswith(("cpu_rss", "cpu_ru_maxrss"))
    assert res["num_rewards"] == len(load_config("tiny").rewards) and res["lora_params"] > 0
    table = capsys.readouterr().out
    assert "weighted_sum" in table and "mgda" in table


def test_bench_rejects_bad_preset(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        bench_main(["step", "--preset", "nope", "--json", str(tmp_path / "x.json")])
    assert exc.value.code == 2
    assert "unknown preset `nope`" in capsys.readouterr().err


def test_bench_rollout_cache_vs_encode(tiny_model_dir, tmp_path):
    from marble.data.records import PromptRecord, to_frame

    table = tmp_path / "t.parquet"
    to_frame([PromptRecord.make("a red cube", "pickscore"),
              PromptRecord.make('a sign "hi"', "ocr")]).to_parquet(table)
    out = tmp_path / "roll.json"
    argv = ["rollout", "--preset", "tiny", "--json", str(out), "--repeats", "1",
            "--model", str(tiny_model_dir), "--table", str(table),
            "--set", "sampling.resolution=32", "--set", "sampling.num_steps=2",
            "--set", "sampling.batch_size=4", "--set", "sampling.images_per_prompt=2",
            "--set", "train.batch_size=2"]
    assert bench_main(argv) == 0
    res = json.loads(out.read_text())
    assert res["batch_size"] == 4
    assert res["rollout"]["encode"]["batch_s"] > 0 and res["rollout"]["cache"]["batch_s"] > 0
    assert res["ratio_cache_to_encode"] > 0
