"""`marble bench step` on the tiny model: the JSON schema, positive numbers, ratios."""

from __future__ import annotations

import json

import pytest

from marble.config import load_config
from marble.tools.bench import main as bench_main


def test_bench_step_writes_schema(tiny_model_dir, tmp_path, capsys):
    from marble.tools.bench import ROWS

    out = tmp_path / "bench.json"
    argv = ["step", "--preset", "tiny", "--json", str(out), "--repeats", "2", "--warmup", "1",
            "--model", str(tiny_model_dir), "--set", "sampling.resolution=32",
            "--set", "train.batch_size=3", "--threads", "1"]
    assert bench_main(argv) == 0
    res = json.loads(out.read_text())
    assert set(res["balancers"]) == set(ROWS) >= {"weighted_sum", "marble", "marble_recompute",
                                                   "mgda", "mgda_diag"}
    for name, r in res["balancers"].items():
        assert r["step_s"] > 0, name
        # total peak (weights included) >= peak over the loaded weights >= 0
        assert r["peak_mb"] >= r["peak_over_weights_mb"] >= 0, name
        assert r["peak_mb"] > res["weights_mb"] > 0, name
        assert len(r["step_s_all"]) == 2
    assert set(res["ratios"]) == set(ROWS) - {"weighted_sum"}
    for name, r in res["ratios"].items():
        ws, this = res["balancers"]["weighted_sum"], res["balancers"][name]
        assert r["time"] == pytest.approx(this["step_s"] / ws["step_s"])
        assert r["memory"] == pytest.approx(this["peak_mb"] / ws["peak_mb"])
    assert set(res["marble_run"]) == {"micro_steps_per_solve", "retain", "recompute"}
    assert set(res["rows"]) == set(ROWS) and "optimizer step" in res["notes"]
    sw = res["adapter_switch"]
    assert sw["forward_cpu_s"] > 0 and sw["ratio_to_forward"] >= 0
    assert res["memory_kind"].startswith(("cpu_rss", "cpu_ru_maxrss")) and res["threads"] == 1
    assert res["num_rewards"] == len(load_config("tiny").rewards) and res["lora_params"] > 0
    table = capsys.readouterr().out
    assert "weighted_sum" in table and "mgda_diag" in table and "marble_run:recompute" in table


def test_summarize_marble_run_is_amortized_mix_and_max_peak():
    from marble.tools.bench import summarize

    def row(s, total, over):
        return {"step_s": s, "step_s_min": s, "step_cpu_s": s, "peak_mb": total,
                "peak_over_weights_mb": over,
                "peak_step_mb": over}

    result = {"weighted_sum": row(1.0, 100.0, 10.0), "marble": row(1.0, 101.0, 11.0),
              "marble_recompute": row(5.0, 100.5, 10.5), "mgda": row(3.0, 120.0, 30.0),
              "mgda_diag": row(4.0, 121.0, 31.0)}
    out = summarize(result, micro_steps_per_solve=10)
    assert out["ratios"]["mgda"]["time"] == 3.0
    assert out["ratios"]["mgda"]["memory_over_weights"] == 3.0
    run = out["marble_run"]
    assert run["recompute"]["step_s"] == pytest.approx((9 * 1.0 + 5.0) / 10)
    assert run["recompute"]["peak_mb"] == 101.0 and run["retain"]["peak_mb"] == 120.0
    assert run["retain"]["memory"] == pytest.approx(1.2)
    assert run["retain"]["time"] == pytest.approx((9 * 1.0 + 3.0) / 10)


def test_bench_rows_run_what_they_name(tiny_model_dir):
    """Each row's balancer does the step its row says: amortized, recompute full solve
    (same gradient as the retained one), diagnostics only in mgda_diag."""
    import torch

    from marble.models import load_pipeline
    from marble.models.lora import add_lora_adapters, trainable_lora_parameters
    from marble.tools.bench import ROWS, make_balancers, synthetic_batch
    from marble.tools.micro_step_call import one_micro_step
    from marble.training.trainer import autocast_factory

    cfg = load_config("tiny", overrides=["sampling.resolution=32", "train.batch_size=3"])
    pipe = load_pipeline(str(tiny_model_dir), dtype=torch.float32, device=torch.device("cpu"))
    add_lora_adapters(pipe.transformer, rank=2, alpha=4, targets=cfg.model.lora_targets, seed=0)
    params = trainable_lora_parameters(pipe.transformer)
    with torch.no_grad():  # LoRA B starts at zero: move it so every gradient is non-trivial
        for p in params:
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    batch = synthetic_batch(pipe, cfg, torch.device("cpu"), seed=0)
    bals, grads, metrics = make_balancers(cfg), {}, {}
    for row in ROWS:
        for p in params:
            p.grad = None
        metrics[row] = one_micro_step(pipe, cfg, batch, bals[row], params,
                                      autocast_factory("no", torch.device("cpu")),
                                      micro_index=ROWS[row][2])
        grads[row] = torch.cat([p.grad.reshape(-1) for p in params])
    assert metrics["marble"]["full_solve"] == 0.0 and metrics["weighted_sum"]["full_solve"] == 0.0
    assert all(metrics[r]["full_solve"] == 1.0 for r in ("marble_recompute", "mgda", "mgda_diag"))
    torch.testing.assert_close(grads["marble_recompute"], grads["mgda"], rtol=1e-5, atol=1e-7)
    assert "cos_ws_min" in metrics["mgda_diag"]
    assert not any(k.startswith("cos") for r in ROWS if r != "mgda_diag" for k in metrics[r])


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


def test_bench_rows_subset_and_bad_rows(tmp_path, capsys):
    from marble.tools.bench import summarize

    with pytest.raises(SystemExit) as exc:
        bench_main(["step", "--preset", "tiny", "--json", str(tmp_path / "x.json"),
                    "--rows", "marble,nope"])
    assert exc.value.code == 2 and "--rows 'marble,nope'" in capsys.readouterr().err
    # ratios of a subset; paired ratio = median over repeats of row / weighted_sum
    base = {"step_s": 1.0, "step_s_min": 1.0, "step_cpu_s": 1.0, "peak_mb": 10.0,
            "peak_over_weights_mb": 1.0, "peak_step_mb": 1.0}
    result = {"weighted_sum": {**base, "step_s_all": [1.0, 2.0, 4.0]},
              "marble": {**base, "step_s_all": [1.1, 2.2, 4.4]}}
    out = summarize(result, micro_steps_per_solve=5)
    assert out["ratios"]["marble"]["time_paired"] == pytest.approx(1.1)
    assert set(out["marble_run"]) == {"micro_steps_per_solve"}
