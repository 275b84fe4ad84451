"""End-to-end training on the tiny SD3: every balancer, exact resume, torchrun, CLI errors.

Settings are the smallest that still exercise every path: 32 px (4x4 latents), 3
sampling steps (T_train = 2), 3 prompts x 2 images per epoch, 2 micro-batches.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from checkpoint_compare import assert_same_checkpoint
from safetensors.torch import load_file

from marble.balance import METHODS
from marble.config_balancers import balancer_descriptor
from marble.data.records import PromptRecord, to_frame
from marble.train import main as train_main
from marble.training.checkpoint import checkpoint_dir

REWARDS = ["toy_brightness", "toy_saturation", "toy_text_contrast", "toy_color_match"]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def table_path(tmp_path_factory) -> Path:
    """Two prompts per source; toy_color_match applies only to the coloured GenEval ones."""
    rows = [
        PromptRecord.make("a photo of a red apple", "geneval",
                          {"tag": "color_attr", "include": [{"class": "apple", "count": 1,
                                                             "color": "red"}]}),
        PromptRecord.make("a photo of a dog", "geneval",
                          {"tag": "single_object", "include": [{"class": "dog", "count": 1}]}),
        PromptRecord.make('a sign that says "hello"', "ocr"),
        PromptRecord.make('a shop front reading "open"', "ocr"),
        PromptRecord.make("a castle at dawn", "pickscore"),
        PromptRecord.make("a cat on a sofa", "pickscore"),
    ]
    masks = {"toy_brightness": [True] * 6, "toy_saturation": [True] * 6,
             "toy_text_contrast": [False, False, True, True, False, False],
             "toy_color_match": [True, False, False, False, False, False]}
    out = tmp_path_factory.mktemp("data") / "train.parquet"
    to_frame(rows, masks).to_parquet(out)
    return out


def small_args(model: Path, table: Path, out: Path, method: str = "marble", world: int = 1,
               extra: tuple[str, ...] = ()) -> list[str]:
    per_rank = 6 // world  # the same global batch (6 rollouts) whatever the world size
    sets = [
        f"model.path={model}", f"data.train={table}", "sampling.num_steps=3",
        "sampling.resolution=32", "sampling.images_per_prompt=2",
        f"sampling.batch_size={per_rank}", "sampling.num_batches_per_epoch=1",
        f"train.batch_size={3 if world == 1 else per_rank}", "train.save_every=2",
        f"balancer.method={method}", "balancer.amortize_every=2", *extra,
    ]
    return ["--preset", "tiny", "--output-dir", str(out), "--no-progress",
            *[x for s in sets for x in ("--set", s)]]


def read_metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]


def adapters(run: Path, step: int) -> dict:
    return load_file(str(run / "checkpoints" / f"checkpoint-{step:06d}" / "adapters.safetensors"))


# The methods that balance gradients on the trainer's schedule (the zoo and the advantage-level
# ones train in tests/test_every_component.py), read off the registry, not listed by hand.
GRADIENT_METHODS = [m for m in METHODS if balancer_descriptor(m).cadence in ("weighted_sum", "amortized")]


@pytest.mark.parametrize("method", GRADIENT_METHODS)
def test_tiny_training_each_balancer(method, tiny_model_dir, table_path, tmp_path):
    d = balancer_descriptor(method)
    run = tmp_path / method
    # A cap below step 2's 0.002 (decay type 1: min(0.001 s, cap)): the trainer must pass it on.
    argv = small_args(tiny_model_dir, table_path, run, method,
                      extra=("train.old_decay_cap=0.0015",)) + ["--max-steps", "2"]
    assert train_main(argv) == 0
    records = read_metrics(run)
    assert [r["step"] for r in records] == [1, 2]
    last = records[-1]
    for key in ["epoch", "balancer", "time/step_s", "time/rollout_s", "loss/policy", "loss/kl",
                "grad_norm", "old_decay", "ema_decay", "full_solve"] + [
            f"{p}/{n}" for n in REWARDS for p in ("reward", "reward_applicable", "reward_nan",
                                                   "adv_std", "dilution")] + [
            f"time/reward_{n}_s" for n in REWARDS]:
        assert key in last, f"{method}: metrics.jsonl lacks {key}"
    assert last["balancer"] == method
    # Weight EMA after the step counter moves, as the reference: s = 1, 2 -> 2/11, 3/12.
    assert [r["ema_decay"] for r in records] == pytest.approx([2 / 11, 3 / 12])
    # Old policy blended after the step counter moves: s = 1 -> 0.001, s = 2 -> capped 0.0015.
    assert [r["old_decay"] for r in records] == pytest.approx([0.001, 0.0015], rel=1e-12)
    assert all(r["skipped_step"] == 0.0 and r["loss_scale"] == 1.0 for r in records)
    assert all(torch.isfinite(torch.tensor(r["loss/policy"])) for r in records)
    assert last["reward_applicable/toy_brightness"] == 6 and last["reward_nan/toy_brightness"] == 0
    assert last["reward_applicable/toy_color_match"] in (0, 2)  # only the red-apple prompt
    if d.cadence != "weighted_sum":
        assert f"alpha/{REWARDS[0]}" in last
    if d.min_norm_tol is not None:  # full solves log the cosine diagnostics
        assert "cos_min" in records[0] and "anti_aligned" in records[0]
        assert records[0]["full_solve"] == 1.0
    if d.cached:  # amortize_every=2: step 1 (index 1) runs on the cached alpha
        assert records[1]["full_solve"] == 0.0
    ad = adapters(run, 2)
    moved = [k for k in ad if k.startswith("default::") and "lora_B" in k and ad[k].abs().max() > 0]
    assert moved, "LoRA B matrices (zero at init) did not move"
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["final_step"] == 2 and summary["last_checkpoint"].endswith("checkpoint-000002")
    assert set(summary["final_rewards"]) == {f"reward/{n}" for n in REWARDS}
    provenance = json.loads((run / "provenance.json").read_text())  # marble.runtime.provenance
    assert provenance["config"]["balancer"]["method"] == method
    assert provenance["versions"]["torch"].split("+")[0] == torch.__version__.split("+")[0]


def test_checkpoint_lora_loads_into_pipeline(tiny_model_dir, table_path, tmp_path):
    from diffusers import StableDiffusion3Pipeline

    run = tmp_path / "run"
    assert train_main(small_args(tiny_model_dir, table_path, run, "equal_alpha") +
                      ["--max-steps", "1"]) == 0
    ckpt = run / "checkpoints" / "checkpoint-000001"
    assert (ckpt / "COMPLETE").is_file() and (ckpt / "optimizer.pt").is_file()
    state = torch.load(ckpt / "state.pt", weights_only=True)
    assert state["step"] == 1 and state["epoch"] == 1
    pipe = StableDiffusion3Pipeline.from_pretrained(str(tiny_model_dir))
    pipe.load_lora_weights(str(ckpt / "lora"))
    assert any("lora" in n for n, _ in pipe.transformer.named_parameters())


def test_resume_is_bitwise(tiny_model_dir, table_path, tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert train_main(small_args(tiny_model_dir, table_path, straight) + ["--max-steps", "4"]) == 0
    assert train_main(small_args(tiny_model_dir, table_path, resumed) + ["--max-steps", "2"]) == 0
    # What a kill after step 2 leaves behind: a metrics line past the checkpoint, a torn
    # line, and a half-written checkpoint folder. Resume must ignore all three.
    with open(resumed / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"step": 3, "stale": True}) + "\n" + '{"step": 4, "lo')
    (resumed / "checkpoints" / "checkpoint-000003").mkdir()
    assert train_main(small_args(tiny_model_dir, table_path, resumed) + ["--max-steps", "4"]) == 0
    # Every file of the checkpoint, the EMA weights evaluation loads (lora/) included.
    assert_same_checkpoint(checkpoint_dir(straight, 4), checkpoint_dir(resumed, 4))
    ma, mb = read_metrics(straight), read_metrics(resumed)
    assert [r["step"] for r in mb] == [1, 2, 3, 4]
    for ra, rb in zip(ma, mb):
        for key in ("loss/policy", "grad_norm", "reward/toy_brightness", "alpha/toy_saturation"):
            assert ra[key] == rb[key], f"step {ra['step']}: {key} {ra[key]} != {rb[key]}"
    summary = json.loads((resumed / "train_summary.json").read_text())
    assert summary["resumed_from"].endswith("checkpoint-000002")


def _inject_overflow(monkeypatch, at_step: int) -> None:
    """Blow up x_t (x 1e6: inf in fp16) on the first micro-step of optimizer step `at_step`."""
    import dataclasses
    import functools

    from marble.training import microstep

    real = microstep.build_micro_step

    @functools.wraps(real)
    def build(transformer, batch, train_cfg, params, autocast, *, scale, global_step,
              micro_index, grad_scaler=None, per_sample=False):
        if global_step == at_step and micro_index == 0:
            batch = dataclasses.replace(batch, x_t=batch.x_t * 1e6)
        return real(transformer, batch, train_cfg, params, autocast, scale=scale,
                    global_step=global_step, micro_index=micro_index, grad_scaler=grad_scaler,
                    per_sample=per_sample)

    monkeypatch.setattr(microstep, "build_micro_step", build)  # where run_micro_step calls it


def test_fp16_gradscaler_skips_overflow_and_resumes_bitwise(monkeypatch, tiny_model_dir,
                                                            table_path, tmp_path):
    """tiny_fp16 (autocast fp16 + GradScaler("cpu")), mgda: the full solve zeroes the
    overflowed entries, the trainer still skips the step and the scaler backs off."""
    _inject_overflow(monkeypatch, at_step=1)

    def args(run, steps):
        argv = small_args(tiny_model_dir, table_path, run, "mgda", extra=("train.save_every=1",))
        argv[argv.index("tiny")] = "tiny_fp16"
        return argv + ["--max-steps", str(steps)]

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert train_main(args(straight, 3)) == 0
    records = read_metrics(straight)
    assert [r["skipped_step"] for r in records] == [0.0, 1.0, 0.0]
    assert [r["loss_scale"] for r in records] == [65536.0, 65536.0, 32768.0]
    assert records[1]["nonfinite_grad_entries"] > 0
    for r in (records[0], records[2]):  # logged unscaled (x65536 would be ~1e6)
        logged = [k for k in r if k.startswith(("loss/", "grad_norm"))]
        assert "grad_norm/toy_brightness" in logged
        # null = a reward absent from the micro-batch (its loss is not logged as 0; strict JSON)
        assert all(r[k] is None or abs(r[k]) < 1e3 for k in logged), {k: r[k] for k in logged}
    a1, a2, a3 = adapters(straight, 1), adapters(straight, 2), adapters(straight, 3)
    trained = [k for k in a1 if k.startswith("default::")]
    assert all(torch.equal(a1[k], a2[k]) for k in trained), "the overflowed step moved weights"
    assert any(not torch.equal(a2[k], a3[k]) for k in trained)
    assert all(torch.isfinite(v).all() for v in a3.values())
    # Resume from step 2 (the run folder as a kill after step 2 leaves it).
    import shutil

    shutil.copytree(straight, resumed)
    shutil.rmtree(resumed / "checkpoints" / "checkpoint-000003")
    assert train_main(args(resumed, 3)) == 0
    assert_same_checkpoint(checkpoint_dir(straight, 3), checkpoint_dir(resumed, 3))
    assert read_metrics(resumed)[-1]["loss_scale"] == 32768.0


def test_torchrun_two_processes_match_one(tiny_model_dir, table_path, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    extra = ("train.save_every=1",)
    assert train_main(small_args(tiny_model_dir, table_path, one, "weighted_sum", 1, extra)
                      + ["--max-steps", "2"]) == 0
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--standalone", "-m", "marble.train",
           *small_args(tiny_model_dir, table_path, two, "weighted_sum", 2, extra),
           "--max-steps", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m1, m2 = read_metrics(one), read_metrics(two)
    assert [r["step"] for r in m2] == [1, 2]
    for r1, r2 in zip(m1, m2):
        for n in REWARDS:
            assert r1[f"reward_applicable/{n}"] == r2[f"reward_applicable/{n}"]
        assert r1["reward/toy_brightness"] == pytest.approx(r2["reward/toy_brightness"], rel=1e-5)
        assert r1["grad_norm"] == pytest.approx(r2["grad_norm"], rel=1e-4)
        assert r1["loss/policy"] == pytest.approx(r2["loss/policy"], rel=1e-4)
    a, b = adapters(one, 2), adapters(two, 2)
    for key in a:
        # Float32 reduction order differs (gather, grad all-reduce); Adam amplifies that
        # on near-zero gradients, so the bound is a fraction of one lr-sized update.
        torch.testing.assert_close(a[key], b[key], rtol=1e-3, atol=1e-4, msg=key)


def _error_line(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exc:
        train_main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_cli_errors_name_the_problem(capsys, tiny_model_dir, table_path, tmp_path):
    base = small_args(tiny_model_dir, table_path, tmp_path / "e")
    assert "train.nope" in _error_line(capsys, base + ["--set", "train.nope=1"])
    assert "unknown preset `nope`" in _error_line(
        capsys, ["--preset", "nope", "--output-dir", str(tmp_path / "x")])
    missing = tmp_path / "models" / "absent"
    err = _error_line(capsys, base + ["--set", f"model.path={missing}"])
    assert "model folder not found" in err and str(missing) in err
    # A run folder written by another config is refused, naming the differing key.
    (tmp_path / "e").mkdir()
    from marble.config import dump_yaml, load_config

    sets = [base[i + 1] for i, x in enumerate(base) if x == "--set"]
    other = load_config("tiny", overrides=sets + ["train.lr=0.5"])
    (tmp_path / "e" / "config.yaml").write_text(dump_yaml(other))
    assert "train.lr" in _error_line(capsys, base)


def test_cli_error_in_subprocess(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "marble.train", "--preset", "tiny",
                           "--output-dir", str(tmp_path / "r"), "--set", "balancer.bogus=1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("marble train: error:")
    assert "balancer.bogus" in proc.stderr
    assert not (tmp_path / "r").exists()


def test_recompute_full_solves_train_like_retain(tiny_model_dir, table_path, tmp_path):
    """`balancer.full_solve: recompute` (one forward per pass, via MicroStep.recompute in the
    trainer) ends with the adapters of the retained-graph run: full solves on step 0,
    amortized steps with diagnostics on step 1."""
    final = {}
    for mode in ("retain", "recompute"):
        run = tmp_path / mode
        argv = small_args(tiny_model_dir, table_path, run, "marble",
                          extra=(f"balancer.full_solve={mode}",)) + ["--max-steps", "2"]
        assert train_main(argv) == 0
        final[mode] = adapters(run, 2)
        assert [r["full_solve"] for r in read_metrics(run)] == [1.0, 0.0]
    for key, value in final["retain"].items():
        torch.testing.assert_close(final["recompute"][key], value, rtol=1e-5, atol=1e-6)


def test_rollout_decodes_under_the_runs_autocast(monkeypatch, tiny_model_dir, table_path,
                                                 tmp_path):
    """As the reference's pipeline call: the rollout's VAE decode runs inside the run's
    autocast (fp16 here), not in fp32 outside it."""
    import marble.training.rollout as rollout

    seen, decode = [], rollout.decode_latents

    def spy(pipe, latents):
        seen.append(torch.is_autocast_enabled("cpu") and
                    torch.get_autocast_dtype("cpu") == torch.float16)
        return decode(pipe, latents)

    monkeypatch.setattr(rollout, "decode_latents", spy)  # where the rollout calls it
    argv = small_args(tiny_model_dir, table_path, tmp_path / "run", "weighted_sum")
    argv[argv.index("tiny")] = "tiny_fp16"
    assert train_main(argv + ["--max-steps", "1"]) == 0
    assert seen and all(seen)


@pytest.mark.parametrize("method", ["marble", "weighted_sum"])
def test_diagnostics_log_three_levels_and_leave_the_weights_bitwise(method, tiny_model_dir,
                                                                    table_path, tmp_path):
    """Issue 36: with balancer.diagnostics_every=1 every micro-step is measured (its index and
    weight source logged), and the step and update levels are logged; with the diagnostics off
    the run ends with the same weights to the bit (they change no gradient and no RNG)."""
    from marble.config import grad_accumulation, load_config, training_timesteps

    final = {}
    for every in (0, 1):
        run = tmp_path / f"diag{every}"
        argv = small_args(tiny_model_dir, table_path, run, method,
                          extra=(f"balancer.diagnostics_every={every}",)) + ["--max-steps", "2"]
        assert train_main(argv) == 0
        final[every] = adapters(run, 2)
        records = read_metrics(run)
        if every == 0:
            assert all("diag_micro_steps" not in r and "cos_min" not in r for r in records)
            continue
        cfg = load_config("tiny", overrides=[argv[i + 1] for i, a in enumerate(argv) if a == "--set"])
        per_step = grad_accumulation(cfg) * training_timesteps(cfg)
        assert per_step > 1
        for r in records:
            assert r["diag_micro_steps"] == per_step == len(r["diag_micro"])
            assert [m["micro"] for m in r["diag_micro"]] == list(range(per_step))
            for key in ("anti_aligned_micro", "anti_aligned_step", "anti_aligned_update"):
                assert r[key] in (0.0, 1.0) or 0.0 < r[key] < 1.0, (key, r[key])
            assert all(-1 <= r[f"cos_{lv}/{n}"] <= 1 for lv in ("step", "update")
                       for n in REWARDS if r[f"cos_{lv}/{n}"] is not None)  # undefined: null (strict JSON)
        sources = [[m["source"] for m in r["diag_micro"]] for r in records]
        if method == "marble":  # amortize_every=2: step 0 solves everywhere (warm-up) or on micro 0
            assert sources[0][0] == "fresh"
            assert set(sources[1]) == {"earlier_step"}
        else:
            assert all(set(s) == {"fixed"} for s in sources)
    for key, value in final[0].items():
        assert torch.equal(final[1][key], value), key
