"""`make gpu-check`'s script on the CPU (`--tiny`): the plumbing, not the figures."""

from __future__ import annotations

import json
import math


def test_part_timeouts_fit_the_budget():
    from marble.tools.gpu_check import BUDGET_S, PHASE_TIMEOUTS

    assert sum(PHASE_TIMEOUTS.values()) <= BUDGET_S == 480  # <= 8 minutes in all


def test_gpu_check_tiny_plumbing(tmp_path, capsys):
    from marble.tools.gpu_check import BENCH_ROWS, main

    out = tmp_path / "gpu_check.json"
    assert main(["--tiny", "--repeats", "1", "--work", str(tmp_path / "w"), "--out", str(out)]) == 0
    res = json.loads(capsys.readouterr().out)  # stdout is exactly the JSON
    assert json.loads(out.read_text()) == json.loads(json.dumps(res))
    assert {n: p["status"] for n, p in res["phases"].items()} == {
        n: "ok" for n in ("env", "bench_fp32_base", "bench_fp16_base", "rollout", "profile",
                          "score", "train_resume")}
    assert res["env"]["missing"] == {} and res["env"]["torch"]
    for base in ("fp32", "fp16"):
        bench = res[f"bench_{base}_base"]
        assert set(bench["balancers"]) == set(BENCH_ROWS.split(",")) and bench["base_dtype"] == base
        assert all(r["step_s"] > 0 for r in bench["balancers"].values()), base
        assert bench["adapter_switch"]["forward_cpu_s"] > 0
    assert res["rollout"]["rollout"]["cache"]["batch_s"] > 0
    # CPU plumbing: host reads counted instead of CUDA syncs (none in the amortized step)
    assert res["profile"]["amortized"]["device_syncs"] == 0
    assert res["profile"]["full_solve"]["device_syncs"] == 1
    check_score_phase(res["score"])
    steps = res["train"]["steps"]
    assert [s["step"] for s in steps] == [1, 2, 3]
    # rho_07's code path: a full solve at step 0, cached alpha after; fp16 GradScaler.
    assert [s["full_solve"] for s in steps] == [1.0, 0.0, 0.0]
    assert all(s["loss_scale"] == 65536.0 and s["skipped_step"] == 0.0 for s in steps)
    resume = res["resume"]
    assert resume["resumed_from"] == "checkpoint-000002" and resume["final_step"] == 3
    files = resume["files"]
    assert {"adapters.safetensors", "optimizer.pt", "state.pt"} <= set(files)
    assert any(f.startswith("lora/") for f in files)  # the EMA weights evaluation loads
    assert resume["bitwise_equal"] and set(files.values()) == {0.0}
    assert res["paper_8xH200"]["mgda"]["time"] == 0.56


# Scorers whose stack is transformers alone: built and scored wherever the check runs.
ALWAYS_SCORED = ("pickscore", "clipscore", "imagereward", "aesthetic")
# Each optional scorer's stack, named in its skip reason.
OPTIONAL_STACK = {"hpsv2": "open_clip", "geneval": "mmdet", "ocr": "rapidocr"}


def check_score_phase(score: dict) -> None:
    """Every paper reward scored (finite, one score an image) or skipped naming its stack."""
    from marble.tools.gpu_score import PAPER_REWARDS

    assert score["batch"] == [3, 3, 32, 32] and score["device"] == "cpu"
    scorers = score["scorers"]
    assert list(scorers) == list(PAPER_REWARDS)
    for name, entry in scorers.items():
        if entry["status"] == "skipped":
            assert name in OPTIONAL_STACK and OPTIONAL_STACK[name] in entry["reason"], (name, entry)
            continue
        assert entry["status"] == "ok", (name, entry)
        assert entry["batch"] == len(entry["scores"]) == 3 and entry["nan"] == 0, name
        assert all(math.isfinite(x) for x in entry["scores"]), name
        assert entry["device"] == "cpu" and {"build_s", "first_call_s", "score_s", "write_s"} <= set(entry)
        assert entry["dtype"] == ([] if name == "ocr" else ["float32"]), name
    assert all(scorers[n]["status"] == "ok" for n in ALWAYS_SCORED)
    assert scorers["clipscore"]["engine"].endswith("clip-tiny")  # the replica folder it loaded


def test_a_failed_phase_keeps_what_it_finished():
    from marble.tools.gpu_check import _phase

    def timed_out():
        exc = TimeoutError("score phase ran past 80 s")
        exc.partial = {"scorers": {"pickscore": {"status": "ok"}}}  # as score() attaches it
        raise exc

    result = {"phases": {}}
    _phase(result, "score", timed_out)
    assert result["phases"]["score"]["status"] == "TimeoutError: score phase ran past 80 s"
    assert result["score"] == {"scorers": {"pickscore": {"status": "ok"}}}


def test_compare_checkpoints_names_the_differing_file(tmp_path):
    import torch
    from safetensors.torch import save_file

    from marble.tools.gpu_check import compare_checkpoints

    a, b = tmp_path / "a", tmp_path / "b"
    for d, v in ((a, 1.0), (b, 1.5)):
        (d / "lora").mkdir(parents=True)
        save_file({"w": torch.ones(2)}, str(d / "adapters.safetensors"))
        save_file({"w": torch.full((2,), v)}, str(d / "lora" / "weights.safetensors"))
        torch.save({"step": 3, "rng": torch.arange(3)}, d / "state.pt")
    out = compare_checkpoints(a, b)
    assert out["files"] == {"adapters.safetensors": 0.0, "lora/weights.safetensors": 0.5,
                            "state.pt": 0.0}
    assert not out["bitwise_equal"]


def test_score_phase_skips_a_scorer_whose_stack_does_not_import(tmp_path, monkeypatch):
    """Without an ONNX OCR engine (the bare GPU machine, no wheels carried) OCR is skipped,
    naming both engines and their import errors; nothing is written for it."""
    import pytest

    from marble.tools import gpu_score

    missing = {"rapidocr_onnxruntime", "rapidocr", "open_clip", "mmdet"}
    monkeypatch.setattr(gpu_score, "importable",
                        lambda m: f"ModuleNotFoundError: No module named {m!r}" if m in missing else None)
    reps = gpu_score.Replicas(tmp_path, tiny=False, device="cpu")
    for name, stack in OPTIONAL_STACK.items():
        with pytest.raises(gpu_score.Skipped, match=stack) as info:
            reps.options(name)
        assert "No module named" in str(info.value), name
    assert "rapidocr_onnxruntime" in str(info.value) and not any(tmp_path.iterdir())
