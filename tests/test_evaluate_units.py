"""Pure parts of `marble evaluate`: prompts, seeds, sharding, results, averages, checkpoints."""

from __future__ import annotations

import json
import math

import pytest

from marble.evaluation.checkpoints import CheckpointError, resolve_lora
from marble.evaluation.images import image_prompts, quantize_8bit
from marble.evaluation.prompts import batches, load_samples, sample_seed, shard
from marble.evaluation.results import (
    GENEVAL_TAGS,
    ResultsError,
    average_scores,
    check_same_run,
    geneval_summary,
    identity,
    json_scores,
    read_results,
)


def write_raw(root, geneval=(), lines=None):
    (root / "geneval").mkdir(parents=True, exist_ok=True)
    (root / "geneval" / "test_metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in geneval))
    for name in ("ocr", "pickscore", "drawbench"):
        (root / name).mkdir(exist_ok=True)
        (root / name / "test.txt").write_text("\n".join(lines or ["a", "b"]) + "\n")


def test_samples_ids_repeats_and_metadata(tmp_path):
    record = {"tag": "counting", "include": [{"class": "cat", "count": 2}], "prompt": "two cats"}
    write_raw(tmp_path, geneval=[record], lines=["a cat", "a dog", "a cat"])
    draw = load_samples(tmp_path, "drawbench")
    assert [s.sample_id for s in draw] == [0, 1, 2]  # (a blank line is an error, as in assembly)
    assert [s.repeat for s in draw] == [0, 0, 1]
    assert draw[0].prompt_id == draw[2].prompt_id and draw[0].prompt_id != draw[1].prompt_id
    assert draw[0].metadata == {"source": "drawbench"}
    (gen,) = load_samples(tmp_path, "geneval")
    assert gen.prompt == "two cats" and gen.metadata["include"] == record["include"]
    assert gen.metadata["source"] == "geneval"


def test_bad_geneval_line_names_file_and_line(tmp_path):
    write_raw(tmp_path, geneval=[{"prompt": "x", "tag": "single_object", "include": [{"class": "cat", "count": 1}]}])
    path = tmp_path / "geneval" / "test_metadata.jsonl"
    path.write_text(path.read_text() + "{not json\n")
    with pytest.raises(ValueError, match=r"test_metadata.jsonl:2"):
        load_samples(tmp_path, "geneval")
    with pytest.raises(FileNotFoundError, match="--data_dir"):
        load_samples(tmp_path / "missing", "ocr")


def test_sample_seed_is_deterministic_and_distinct():
    assert sample_seed(42, "abc", 0) == sample_seed(42, "abc", 0)
    seeds = {sample_seed(42, "abc", 0), sample_seed(43, "abc", 0), sample_seed(42, "abd", 0),
             sample_seed(42, "abc", 1)}
    assert len(seeds) == 4
    assert all(0 <= s < 2**63 for s in seeds)


@pytest.mark.parametrize("n,world", [(0, 2), (7, 1), (7, 2), (7, 3), (8, 8), (3, 5)])
def test_shards_cover_every_item_once(n, world):
    items = list(range(n))
    parts = [shard(items, r, world) for r in range(world)]
    assert sorted(x for p in parts for x in p) == items
    assert max(map(len, parts)) == len(parts[0])  # rank 0 has the largest share
    assert batches(list(range(5)), 2) == [[0, 1], [2, 3], [4]]


def test_read_results_last_wins_and_torn_tail(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"sample_id": 1, "scores": {"a": 1}}\n{"sample_id": 0, "scores": {}}\n'
                    '{"sample_id": 1, "scores": {"a": 2}}\n{"sample_id": 2, "sco')
    rows = read_results(path)
    assert list(rows) == [0, 1] and rows[1]["scores"] == {"a": 2}
    path.write_text('{"sample_id": 1}\nbroken\n{"sample_id": 2}\n')
    with pytest.raises(ResultsError, match=r"r.jsonl:2"):
        read_results(path)
    assert read_results(tmp_path / "absent.jsonl") == {}


def test_average_scores_counts_nan_and_not_applicable():
    rows = [
        {"scores": json_scores({"r": 1.0, "s": float("nan")}), "not_applicable": ["s"]},
        {"scores": json_scores({"r": 2.0, "s": float("nan")}), "not_applicable": []},
        {"scores": json_scores({"r": 4.5, "s": 3.0}), "not_applicable": []},
    ]
    assert rows[0]["scores"]["s"] is None
    out = average_scores(rows, ["r", "s"])
    assert out["r"] == pytest.approx(2.5) and out["n_r"] == 3 and out["nan_r"] == 0
    assert out["s"] == 3.0 and out["n_s"] == 1 and out["nan_s"] == 1 and out["na_s"] == 1
    assert out["num_samples"] == 3 and "geneval_overall" not in out


def test_geneval_summary_official_overall_is_mean_of_tag_accuracies():
    rows = []
    # single_object gets two samples (acc 1, 0), every other tag one sample of acc 1.
    for tag, acc in [("single_object", 1.0), ("single_object", 0.0)] + [(t, 1.0) for t in GENEVAL_TAGS[1:]]:
        rows.append({"metadata": {"tag": tag}, "scores": {"geneval": acc, "accuracy": acc, "strict_accuracy": 0.0}})
    out = geneval_summary(rows)
    assert out["single_object_accuracy"] == 0.5 and out["counting_accuracy"] == 1.0
    assert out["geneval_overall"] == pytest.approx((0.5 + 5) / 6)
    assert out["accuracy"] == pytest.approx(6 / 7)  # the sample mean differs
    assert out["strict_accuracy"] == 0.0
    partial = geneval_summary(rows[:2])
    assert math.isnan(partial["geneval_overall"]) and partial["geneval_tags_present"] == 1


def test_changed_identity_is_refused_with_the_difference(tmp_path):
    args = {"dataset": "ocr", "num_inference_steps": 40, "seed": 42, "guidance_scale": 1.0}
    (tmp_path / "run_info.json").write_text(json.dumps({"identity": identity(args)}))
    check_same_run(tmp_path / "run_info.json", identity(args))  # same: fine
    with pytest.raises(ResultsError, match=r"num_inference_steps: 40 -> 8"):
        check_same_run(tmp_path / "run_info.json", identity({**args, "num_inference_steps": 8}))


def test_resolve_lora_kinds(tmp_path):
    from marble.training.checkpoint_format import marker_text

    diffusers_dir = tmp_path / "run" / "checkpoints" / "checkpoint-000002" / "lora"
    diffusers_dir.mkdir(parents=True)
    (diffusers_dir / "pytorch_lora_weights.safetensors").write_bytes(b"x")
    (diffusers_dir.parent / "COMPLETE").write_text(marker_text(diffusers_dir.parent))
    incomplete = tmp_path / "run" / "checkpoints" / "checkpoint-000009" / "lora"
    incomplete.mkdir(parents=True)  # no COMPLETE marker: ignored
    by_run = resolve_lora(tmp_path / "run")
    assert by_run.lora_dir == diffusers_dir and by_run.kind == "diffusers"
    assert resolve_lora(diffusers_dir.parent).lora_dir == diffusers_dir
    peft = tmp_path / "peft"
    peft.mkdir()
    (peft / "adapter_config.json").write_text("{}")
    (peft / "adapter_model.safetensors").write_bytes(b"x")
    assert resolve_lora(peft).kind == "peft"
    (tmp_path / "neither").mkdir()
    (tmp_path / "neither" / "model.ckpt").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="neither a marble checkpoint"):
        resolve_lora(tmp_path / "neither")
    (tmp_path / "empty_run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="no usable checkpoint"):
        resolve_lora(tmp_path / "empty_run")
    with pytest.raises(CheckpointError, match="does not exist"):
        resolve_lora(tmp_path / "nope")


def test_quantize_8bit_is_the_saved_level():
    import torch

    x = torch.tensor([-0.1, 0.0, 0.5 / 255, 0.7 / 255, 0.5, 1.0, 1.2])
    q = quantize_8bit(x)
    assert q.tolist() == pytest.approx([0.0, 0.0, 0.0, 1 / 255, 128 / 255, 1.0, 1.0])
    assert torch.equal(quantize_8bit(q), q)  # idempotent: a reloaded PNG quantises to itself


def test_image_prompts_maps_file_names_like_the_reference():
    rows = [{"sample_id": 12, "prompt": "b", "scores": {"r": None}},
            {"sample_id": 3, "prompt": "a", "scores": {"r": 1.5}}]
    assert image_prompts(rows, "jpg") == {"00003.jpg": {"prompt": "a", "scores": {"r": 1.5}},
                                          "00012.jpg": {"prompt": "b", "scores": {"r": None}}}
    assert list(image_prompts(rows, "png")) == ["00003.png", "00012.png"]
    with pytest.raises(ValueError, match="choose from jpg, png"):
        image_prompts(rows, "gif")


def test_hub_references_parse():
    from marble.evaluate import parse_args
    from marble.evaluation.checkpoints import parse_hub_ref

    assert parse_hub_ref("hf:org/name@abc") == ("org/name", "abc")
    assert parse_hub_ref("org/name") == ("org/name", None) and parse_hub_ref("hf:name") == ("name", None)
    for bad in ("hf:", "hf:org/name@", "hf:a/b/c", "hf:/name"):
        with pytest.raises(CheckpointError, match="not a hub LoRA reference"):
            parse_hub_ref(bad)
    args = parse_args(["--dataset", "ocr", "--checkpoint_path", "hf:org/name@v1"])
    assert (args.lora_hf_path, args.checkpoint_path) == ("hf:org/name@v1", None)
    defaults = parse_args(["--dataset", "ocr"])  # the reference's dataset/<name>/ and .jpg images
    assert (defaults.data_dir, defaults.image_format) == ("dataset", "jpg")
