"""Identity by content (issue 32), without a model: inputs replaced under the same path,
restored mtimes, moved projects, failed starts, damaged caches, edited results, a metrics
file rolled back under a live run, a second evaluation on one folder."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import save_file

from marble import evaluate, train
from marble.assets.manifest import Entry
from marble.assets.verify import HashCache as SidecarCache
from marble.assets.verify import problem
from marble.config import dump_yaml, load_config
from marble.data.records import PromptRecord, to_frame
from marble.evaluation.results import ResultsError, check_same_run, identity, read_results
from marble.runtime.fingerprint import HashCache, fingerprint
from marble.training import run_lock
from marble.training.inputs import INPUTS_FILE, current_inputs, write_inputs
from marble.training.metrics import MetricsLog
from marble.training.outcome import failed_run_reason
from marble.training.preflight import preflight
from marble.training.run_dir import TrainError


@pytest.fixture(autouse=True)
def private_hash_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MARBLE_HASH_CACHE", str(tmp_path / "hashes.json"))


def rewrite_keeping_stat(path, data: bytes) -> None:
    """Same size, same mtime: what fooled a size + mtime cache."""
    st = path.stat()
    with open(path, "r+b") as fh:
        fh.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


@pytest.mark.fault("download rewritten with its size and mtime restored")
def test_a_same_size_rewrite_with_the_old_mtime_is_hashed_again(tmp_path):
    import hashlib

    (tmp_path / "w.bin").write_bytes(b"a" * 4096)
    entry = Entry(group="g", path="w.bin", url=None, sha256=hashlib.sha256(b"a" * 4096).hexdigest(), size=4096)
    assert problem(entry, tmp_path, SidecarCache(tmp_path)) is None  # hashed, cached
    rewrite_keeping_stat(tmp_path / "w.bin", b"b")
    assert problem(entry, tmp_path, SidecarCache(tmp_path)).startswith("sha256 ")
    cache = HashCache()
    before = fingerprint(tmp_path / "w.bin", cache)
    rewrite_keeping_stat(tmp_path / "w.bin", b"c")
    assert fingerprint(tmp_path / "w.bin", cache) != before


def tiny_inputs(root):
    """A fake base model folder and a training table under `root` (no weights are loaded)."""
    (root / "model" / "transformer").mkdir(parents=True)
    (root / "model" / "model_index.json").write_text("{}")
    save_file({"w": torch.zeros(64)}, str(root / "model" / "transformer" / "w.safetensors"))
    rows = [PromptRecord.make("a cat", "pickscore"), PromptRecord.make('a "sign"', "ocr")]
    to_frame(rows, {"toy_brightness": [True, True]}).to_parquet(root / "train.parquet")
    return [f"model.path={root / 'model'}", f"data.train={root / 'train.parquet'}",
            "rewards=[{name: toy_brightness}]"]


def started_run(root):
    cfg = load_config("tiny", overrides=tiny_inputs(root))
    run = root / "run"
    run.mkdir()
    (run / "config.yaml").write_text(dump_yaml(cfg))
    write_inputs(run, current_inputs(cfg))
    return cfg, run


@pytest.mark.fault("base model / table replaced under the same path, then resume")
def test_resume_refuses_inputs_replaced_under_the_same_path(tmp_path, fault_trials):
    cfg, run = started_run(tmp_path)
    preflight(cfg, run)  # unchanged: resumes
    weights = tmp_path / "model" / "transformer" / "w.safetensors"
    whole = weights.read_bytes()
    rewrite_keeping_stat(weights, whole[:-4] + b"\1\1\1\1")  # one float changed, same size and mtime
    with pytest.raises(TrainError) as err:
        preflight(cfg, run)
    fault_trials.record("model.path" in str(err.value) and "\n" not in str(err.value), "base model replaced")
    weights.write_bytes(whole)  # restored: resumes again
    preflight(cfg, run)
    table = to_frame([PromptRecord.make("a dog", "pickscore")], {"toy_brightness": [True]})
    table.to_parquet(tmp_path / "train.parquet")
    with pytest.raises(TrainError, match=r"data.train \(") as err:
        preflight(cfg, run)
    fault_trials.record(True, "table replaced")
    assert not fault_trials.lost


@pytest.mark.fault("project moved (absolute paths differ, content equal)")
def test_a_moved_project_resumes(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    started_run(tmp_path / "a")  # config.yaml holds absolute paths under a/
    shutil.move(tmp_path / "a", tmp_path / "b")
    moved = load_config("tiny", overrides=[f"model.path={tmp_path / 'b' / 'model'}",
                                           f"data.train={tmp_path / 'b' / 'train.parquet'}",
                                           "rewards=[{name: toy_brightness}]"])
    preflight(moved, tmp_path / "b" / "run")  # other absolute paths in config.yaml, same content
    inputs = json.loads((tmp_path / "b" / "run" / INPUTS_FILE).read_text())
    assert inputs["data.train"]["fingerprint"].startswith("sha256:")


def _no_training(cfg, out_dir, device=None, progress=True, stop=None, fresh=False,
                 adopt=False):  # run_training's signature
    return {"final_step": 0, "rank": 0}


@pytest.mark.fault("failed starts (unknown reward, empty, damaged or uncovered table, not a model folder)")
@pytest.mark.parametrize("bad,needle", [
    ("rewards=[{name: toy_brightnes}]", "`rewards[0].name` = 'toy_brightnes' is not a reward"),
    ("table:empty", "holds no prompts"),
    ("table:damaged", "is not a readable parquet table"),
    ("table:uncovered", "reward 'toy_brightness' applies to no prompt of `data.train`"),
    ("model:nofolder", "is not a diffusers model folder"),
    ("model:damaged", "w.safetensors: not a readable safetensors file"),
])
def test_a_failed_start_is_one_line_writes_nothing_and_the_fix_runs(tmp_path, capsys, monkeypatch, bad, needle):
    monkeypatch.setattr("marble.training.run.run_training", _no_training)
    good = tiny_inputs(tmp_path)
    sets = list(good)
    if bad.startswith("rewards"):
        sets[2] = bad
    elif bad == "table:empty":
        to_frame([], {"toy_brightness": []}).to_parquet(tmp_path / "empty.parquet")
        sets[1] = f"data.train={tmp_path / 'empty.parquet'}"
    elif bad == "table:uncovered":  # the reward's mask is false on every row
        rows = [PromptRecord.make("a cat", "pickscore")]
        to_frame(rows, {"toy_brightness": [False]}).to_parquet(tmp_path / "uncovered.parquet")
        sets[1] = f"data.train={tmp_path / 'uncovered.parquet'}"
    elif bad == "table:damaged":
        (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
        sets[1] = f"data.train={tmp_path / 'bad.parquet'}"
    elif bad == "model:nofolder":
        (tmp_path / "notmodel").mkdir()
        sets[0] = f"model.path={tmp_path / 'notmodel'}"
    else:  # a truncated weights file; the corrected command below has the whole one
        (tmp_path / "bad").mkdir()
        shutil.copytree(tmp_path / "model", tmp_path / "bad" / "model")
        (tmp_path / "bad" / "model" / "transformer" / "w.safetensors").write_bytes(b"\x10\0\0\0")
        sets[0] = f"model.path={tmp_path / 'bad' / 'model'}"
    argv = ["--preset", "tiny", "--output-dir", str(tmp_path / "run"), "--no-progress"]
    with pytest.raises(SystemExit) as exc:
        train.main(argv + [x for s in sets for x in ("--set", s)])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and needle in err, err
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())
    assert train.main(argv + [x for s in good for x in ("--set", s)]) == 0  # the corrected command


def embed_cache(folder, msl=32, model="random:tiny"):
    from marble.data.embed_cache import model_identity

    folder.mkdir()
    save_file({"prompt_embeds": torch.ones(1, 4, 8), "pooled": torch.ones(1, 8)},
              str(folder / "shard-00000.safetensors"))
    index = {"format": 1, "model": model_identity(model), "max_sequence_length": msl, "dtype": "float32",
             "shards": ["shard-00000.safetensors"], "entries": {},
             "checksums": {"shard-00000.safetensors": HashCache().sha256(folder / "shard-00000.safetensors")}}
    (folder / "index.json").write_text(json.dumps(index))
    return folder


@pytest.mark.fault("embedding cache damaged, or built for another sequence length")
def test_a_damaged_or_foreign_embedding_cache_is_refused_by_name(tmp_path, fault_trials):
    from marble.data.embed_cache import EmbedCacheError, EmbeddingCache

    cache = embed_cache(tmp_path / "cache")
    sets = tiny_inputs(tmp_path)[1:] + ["model.path=random:tiny", f"data.embed_cache={cache}"]
    cfg = load_config("tiny", overrides=sets)
    preflight(cfg, tmp_path / "run")
    EmbeddingCache(cache)
    shard = cache / "shard-00000.safetensors"
    data = bytearray(shard.read_bytes())
    data[-4:] = b"\xff\xff\xff\x7f"  # flipped floats: a NaN where a value was
    rewrite_keeping_stat(shard, bytes(data))
    for check in (lambda: preflight(cfg, tmp_path / "run"), lambda: EmbeddingCache(cache)):
        with pytest.raises((TrainError, EmbedCacheError), match="shard-00000.safetensors: sha256") as err:
            check()
        fault_trials.record(str(cache) in str(err.value), "damaged shard")
    other = embed_cache(tmp_path / "cache64", msl=64)
    with pytest.raises(TrainError, match="built for max_sequence_length 64, this run uses 32"):
        preflight(load_config("tiny", overrides=sets[:-1] + [f"data.embed_cache={other}"]), tmp_path / "run")
    assert not fault_trials.lost


def test_failed_run_reason_names_skipped_steps_and_rewards_nan_throughout():
    ok = {"step": 1, "skipped_step": 0.0, "reward/a": 0.5, "reward_applicable/a": 4}
    assert failed_run_reason([ok], ["a"]) is None
    assert failed_run_reason([], ["a"]) is None
    skipped = [{**ok, "step": i, "skipped_step": 1.0} for i in (1, 2)]
    assert "every one of the 2 logged steps was skipped" in failed_run_reason(skipped, ["a"])
    nan = [{**ok, "step": i, "reward/a": float("nan")} for i in (1, 2)]
    assert "reward 'a' was NaN on every logged step (8 applicable" in failed_run_reason(nan, ["a"])
    assert failed_run_reason(nan[:1] + [ok], ["a"]) is None  # NaN once is an unscorable batch
    never_applied = [{**ok, "reward/a": float("nan"), "reward_applicable/a": 0}]
    assert failed_run_reason(never_applied, ["a"]) is None  # a mask matter, counted elsewhere


@pytest.mark.fault("results jsonl edited: duplicate row, NaN, \"NaN\", Infinity")
@pytest.mark.parametrize("line,needle", [
    ('{"sample_id": 0, "rev": 1, "scores": {"toy": 0.9}}', "sample 0 appears again as revision 1, expected 3"),
    ('{"sample_id": 1, "rev": 1, "scores": {"toy": NaN}}', "score 'toy' = nan is not a finite number"),
    ('{"sample_id": 1, "rev": 1, "scores": {"toy": "NaN"}}', "score 'toy' = 'NaN' is not a finite number"),
    ('{"sample_id": 1, "rev": 1, "scores": {"toy": Infinity}}', "score 'toy' = inf is not a finite number"),
])
def test_edited_results_are_errors_naming_file_and_line(tmp_path, line, needle):
    path = tmp_path / "evaluation_results.jsonl"
    path.write_text('{"sample_id": 0, "rev": 1, "scores": {"toy": 0.5}}\n'
                    '{"sample_id": 0, "rev": 2, "scores": {"toy": 0.5, "other": null}}\n' + line + "\n")
    with pytest.raises(ResultsError, match=rf"{path}:3: .*{needle}"):
        read_results(path)
    path.write_text(path.read_text().splitlines()[0] + "\n" + path.read_text().splitlines()[1] + "\n")
    assert read_results(path)[0]["rev"] == 2  # a rescored sample: the next revision wins


@pytest.mark.fault("results rows removed: fewer than average_scores.json's num_samples")
def test_the_summary_refuses_averages_that_do_not_match_their_results(tmp_path):
    from marble.evaluation.summary import collect

    folder = tmp_path / "eval" / "run" / "ckpt" / "ocr"
    folder.mkdir(parents=True)
    (folder / "average_scores.json").write_text(json.dumps({"num_samples": 2, "toy": 0.5, "n_toy": 2}))
    (folder / "evaluation_results.jsonl").write_text('{"sample_id": 0, "rev": 1, "scores": {"toy": 0.5}}\n')
    with pytest.raises(ResultsError, match="num_samples = 2, but .* holds 1 samples"):
        collect(tmp_path / "eval")
    (folder / "evaluation_results.jsonl").write_text(
        '{"sample_id": 0, "rev": 1, "scores": {"toy": 0.5}}\n{"sample_id": 1, "rev": 1, "scores": {"toy": 0.5}}\n')
    assert len(collect(tmp_path / "eval")) == 3


@pytest.mark.fault("dvc checkout --force rolls metrics.jsonl back under a live run")
def test_metrics_rolled_back_under_a_live_run_are_restored_not_merged(tmp_path):
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path, backends=["jsonl"])
    log.truncate_after(0)  # what resume does first
    for step in (1, 2, 3):
        log.log({"step": step})
    path.write_text('{"step": 1}\n{"step": 2, "from": "the cached version"}\n')  # the checkout
    with pytest.warns(UserWarning, match="changed under this live run"):
        log.log({"step": 4})
    assert [json.loads(x) for x in path.read_text().splitlines()] == [{"step": s} for s in (1, 2, 3, 4)]
    path.unlink()  # removed outright
    with pytest.warns(UserWarning, match="changed under this live run"):
        log.log({"step": 5})
    assert [r["step"] for r in log.read()] == [1, 2, 3, 4, 5]


def test_an_evaluation_identity_compares_content_not_paths(tmp_path):
    info = tmp_path / "run_info.json"
    base = {"dataset": "ocr", "seed": 42}
    first = identity({**base, "model_path": {"path": "/old/models/m", "fingerprint": "tree:1"},
                      "checkpoint": {"path": "/old/runs/r/checkpoints/c", "fingerprint": "tree:2"}})
    info.write_text(json.dumps({"identity": first}))
    moved = identity({**base, "model_path": {"path": "models/m", "fingerprint": "tree:1"},
                      "checkpoint": {"path": "runs/r/checkpoints/c", "fingerprint": "tree:2"}})
    check_same_run(info, moved)  # a moved or copied project: the same evaluation
    replaced = {**moved, "model_path": {"path": "models/m", "fingerprint": "tree:9"}}
    with pytest.raises(ResultsError, match=r"model_path: path /old/models/m, fingerprint tree:1 -> .*tree:9"):
        check_same_run(info, replaced)


@pytest.mark.fault("results folder of the previous format (base and LoRA named by path), or without run_info")
def test_results_of_the_path_identity_format_are_refused_with_the_rebuild(tmp_path):
    info = tmp_path / "run_info.json"
    base = {"dataset": "ocr", "seed": 42}
    models = tmp_path / "models" / "m"
    info.write_text(json.dumps({"identity": identity({**base, "model_path": str(models), "checkpoint": None})}))
    now = identity({**base, "model_path": {"path": str(models), "fingerprint": "tree:9"}, "checkpoint": None})
    with pytest.raises(ResultsError, match=r"earlier marble, whose identity named model_path .* by path.*"
                                           r"rerun this `marble evaluate` command to rebuild") as err:
        check_same_run(info, now)  # the same path spelled: adopted before, whatever it holds now
    assert "\n" not in str(err.value)
    info.unlink()  # results whose identity file went
    (tmp_path / "evaluation_results.jsonl").write_text('{"sample_id": 0, "rev": 1, "scores": {"toy": 0.5}}\n')
    with pytest.raises(ResultsError, match=r"holds evaluation_results.jsonl but no run_info.json.*rebuild"):
        check_same_run(info, now)


def eval_argv(raw, out, *extra):
    return ["--model_path", "never-loaded", "--dataset", "ocr", "--data_dir", str(raw), "--output_dir", str(out),
            "--rewards", "toy_brightness", "--skip_generation", *extra]


@pytest.mark.fault("evaluation start errors: unknown reward, empty prompt file, a second evaluation")
def test_evaluate_refuses_in_one_line_before_writing(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    (tmp_path / "ocr").mkdir()
    (tmp_path / "ocr" / "test.txt").write_text("")
    out = tmp_path / "out"
    assert evaluate.main(eval_argv(tmp_path, out)) == 2
    assert "no prompts to evaluate" in capsys.readouterr().err
    (tmp_path / "ocr" / "test.txt").write_text('a "sign"\n')
    with pytest.raises(SystemExit, match="'toy_brightnes' is not a reward"):
        evaluate.main(eval_argv(tmp_path, out)[:-2] + ["toy_brightnes", "--skip_generation"])
    assert not out.exists()
    lock = run_lock.acquire(out, name=run_lock.EVAL_LOCK_NAME)  # a live evaluation holds it
    try:
        assert evaluate.main(eval_argv(tmp_path, out)) == 2
        err = capsys.readouterr().err.strip()
        assert "is being evaluated by pid" in err and len(err.splitlines()) == 1
    finally:
        run_lock.release(lock)
    assert not (out / "run_info.json").exists()


def test_a_stop_while_loading_does_not_claim_a_checkpoint():
    """`marble train` printed "stopped ... with a checkpoint" when the stop came before any step."""
    assert not train.checkpoint_of_step(None, 0)
    assert not train.checkpoint_of_step("/r/checkpoints/checkpoint-000002", 3)  # resumed at 2, stopped at load
    assert train.checkpoint_of_step("/r/checkpoints/checkpoint-000003", 3)
