"""Assembly: records and ids, malformed input, reward masks, real counts, tiny prompts."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from marble.data import DataError, PromptRecord, load_table, prompt_id, records, reward_masks
from marble.config import RewardSpec
from marble.data.assemble import assemble_split
from marble.rewards import build_masks
from marble.data.cli import main as data_main
from marble.data.tiny_prompts import tiny_prompt_sets

REAL_COUNTS = {"pickscore": 2048, "ocr": 1018, "geneval": 2212, "drawbench": 1000}
# Content rules (spec B): ocr needs a non-empty "double-quoted" span (pickscore test: 63,
# every ocr prompt, none of geneval; drawbench quotes with single quotes), geneval needs
# an `include` clause; pickscore, hpsv2 and clipscore apply everywhere.
REAL_MASKS = {
    "ocr": {"pickscore": 63, "ocr": 1018, "geneval": 0, "drawbench": 0},
    "geneval": {"pickscore": 0, "ocr": 0, "geneval": 2212, "drawbench": 0},
    "pickscore": REAL_COUNTS,
    "clipscore": REAL_COUNTS,
    "hpsv2": REAL_COUNTS,
}
GOOD_GENEVAL = {"tag": "colors", "include": [{"class": "cat", "count": 1, "color": "red"}], "prompt": "a red cat"}


def test_prompt_id_is_sha1_of_source_prompt_and_sorted_metadata():
    meta = {"tag": "colors", "include": [], "source": "geneval"}
    payload = 'geneval\0a red cat\0{"include":[],"tag":"colors"}'
    assert prompt_id("geneval", "a red cat", meta) == hashlib.sha1(payload.encode()).hexdigest()[:16]
    rec = PromptRecord.make("a red cat", "geneval", {"tag": "colors", "include": []})
    assert rec.prompt_id == prompt_id("geneval", "a red cat", {"include": [], "tag": "colors"})
    assert rec.metadata["source"] == "geneval"
    assert prompt_id("ocr", "a red cat") != prompt_id("pickscore", "a red cat")


def test_load_table_names_a_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        load_table(tmp_path / "nope.parquet")


def write_raw(root: Path, files: dict[str, bytes | str]) -> Path:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return root


def test_assemble_writes_table_masks_and_summary(tmp_path, capsys):
    raw = write_raw(tmp_path / "raw", {
        "pickscore/test.txt": 'a dog\na sign saying "hi"\n',
        "ocr/test.txt": 'a cup with "Good Morning" on it',  # no trailing newline
        "geneval/test_metadata.jsonl": json.dumps(GOOD_GENEVAL) + "\n",
        "drawbench/test.txt": "a 'quoted' thing\n",
    })
    out = tmp_path / "out"
    rc = data_main(["assemble", "--raw-dir", str(raw), "--out-dir", str(out), "--split", "test",
                    "--rewards", "toy_brightness,toy_text_contrast,toy_color_match"])
    assert rc == 0
    df = load_table(out / "test.parquet")
    assert df["source"].tolist() == ["pickscore", "pickscore", "ocr", "geneval", "drawbench"]
    masks = reward_masks(df)
    assert masks["toy_brightness"] == [True] * 5
    assert masks["toy_text_contrast"] == [False, True, True, False, False]
    assert masks["toy_color_match"] == [False, False, False, True, False]
    recs = records(df)
    assert recs[3].metadata == {**GOOD_GENEVAL, "source": "geneval"}
    assert recs[2].prompt == 'a cup with "Good Morning" on it'
    summary = (out / "test_summary.csv").read_text().splitlines()
    assert summary[0] == "source,prompts,toy_brightness,toy_text_contrast,toy_color_match"
    assert "total,5,5,2,1" in summary
    assert not (out / "train.parquet").exists()


def test_applies_to_override_from_config(tmp_path):
    raw = write_raw(tmp_path / "raw", {"pickscore/train.txt": "a\nb\n", "ocr/train.txt": 'c "d"\n'})
    rewards = build_masks([RewardSpec(name="toy_brightness", applies_to=["ocr"])])
    part = assemble_split(raw, "train", rewards)
    assert part.table["applies__toy_brightness"].tolist() == [False, False, True]


MALFORMED = {
    "bad_json": ("geneval/test_metadata.jsonl", [json.dumps(GOOD_GENEVAL), '{"tag": "colors",'], 2, "bad JSON"),
    "unknown_tag": ("geneval/test_metadata.jsonl",
                    [json.dumps(GOOD_GENEVAL)] * 2 + [json.dumps({**GOOD_GENEVAL, "tag": "shapes"})], 3,
                    "unknown GenEval tag 'shapes'"),
    "no_prompt": ("geneval/test_metadata.jsonl", [json.dumps({k: v for k, v in GOOD_GENEVAL.items() if k != "prompt"})],
                  1, "prompt"),
    "no_include": ("geneval/test_metadata.jsonl",
                   [json.dumps({k: v for k, v in GOOD_GENEVAL.items() if k != "include"})], 1, "include"),
    "empty_prompt": ("pickscore/test.txt", ["a dog", "   ", "a cat"], 2, "empty prompt"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_input_names_file_and_line_and_writes_nothing(tmp_path, capsys, case):
    rel, lines, lineno, message = MALFORMED[case]
    # train is fine and is assembled first: a later failure must still leave no output
    files = {"pickscore/train.txt": "ok\n", "pickscore/test.txt": "fine prompt\n", rel: "\n".join(lines) + "\n"}
    raw = write_raw(tmp_path / "raw", files)
    out = tmp_path / "out"
    rc = data_main(["assemble", "--raw-dir", str(raw), "--out-dir", str(out), "--split", "all",
                    "--rewards", "toy_brightness"])
    err = capsys.readouterr().err
    assert rc == 1
    assert f"DataError: {rel}:{lineno}:" in err and message in err
    assert not out.exists() or not any(out.iterdir())


def test_invalid_utf8_names_the_line(tmp_path):
    raw = write_raw(tmp_path / "raw", {"ocr/test.txt": b'one "a"\ntwo "b"\nth\xffree "c"\n'})
    with pytest.raises(DataError, match=r"^ocr/test.txt:3: invalid UTF-8"):
        assemble_split(raw, "test", {})


def test_missing_configured_source_is_an_error_optional_is_skipped(tmp_path, caplog):
    raw = write_raw(tmp_path / "raw", {"pickscore/test.txt": "x\n"})
    with pytest.raises(DataError, match="configured source 'drawbench' is missing"):
        assemble_split(raw, "test", {}, sources=["pickscore", "drawbench"])
    part = assemble_split(raw, "test", {})
    assert part.table["source"].tolist() == ["pickscore"]
    assert "drawbench" in caplog.text


def test_tiny_prompts_are_deterministic_disjoint_and_assemble_cleanly(tmp_path):
    a, b = tiny_prompt_sets(seed=0), tiny_prompt_sets(seed=0)
    assert a == b and tiny_prompt_sets(seed=1) != a
    for source in ("pickscore", "ocr", "geneval"):
        assert len(a[source]["train"]) == 48 and len(a[source]["test"]) == 12
        key = (lambda r: r["prompt"]) if source == "geneval" else (lambda r: r)
        assert not {key(r) for r in a[source]["train"]} & {key(r) for r in a[source]["test"]}
    assert {r["tag"] for r in a["geneval"]["train"]} == {
        "single_object", "two_object", "counting", "colors", "position", "color_attr"}
    raw, out = tmp_path / "raw", tmp_path / "ds"
    assert data_main(["tiny", "--out", str(raw)]) == 0
    assert data_main(["assemble", "--raw-dir", str(raw), "--out-dir", str(out), "--preset", "tiny"]) == 0
    train, test = load_table(out / "train.parquet"), load_table(out / "test.parquet")
    assert train["source"].value_counts().to_dict() == {"pickscore": 48, "ocr": 48, "geneval": 48}
    assert len(test) == 48 and set(test["source"]) == {"pickscore", "ocr", "geneval", "drawbench"}
    masks = reward_masks(train)
    assert all(masks["toy_brightness"])
    colored = [any("color" in c for c in json.loads(m)["include"])
               for m in train["metadata"][train.source == "geneval"]]
    assert sum(masks["toy_color_match"]) == sum(colored) > 0


@pytest.fixture(scope="module")
def real_test_records(shared_dir):
    from marble.data.assemble import read_split

    return read_split(shared_dir / "datasets", "test")


def test_real_test_split_row_counts(real_test_records):
    from collections import Counter

    assert Counter(r.source for r in real_test_records) == REAL_COUNTS


@pytest.mark.parametrize("reward", sorted(REAL_MASKS))
def test_real_mask_counts_per_reward(real_test_records, reward):
    from collections import Counter

    built = build_masks([RewardSpec(name=reward)])[reward]  # a mask needs no heavy stack and no weights
    counts = Counter(r.source for r in real_test_records if built.applies(r.prompt, r.metadata))
    assert {s: counts.get(s, 0) for s in REAL_COUNTS} == REAL_MASKS[reward]


def test_paper_preset_masks_use_the_reference_ocr_rule(real_test_records):
    """The paper presets set `ocr.reference_rules` (target = text after the first `"`), and
    assembly must honour it: 65 pickscore test prompts instead of 63 under our rule."""
    from collections import Counter

    from marble.config import load_config

    specs = load_config("rho_07").rewards
    built = build_masks([s for s in specs if s.name == "ocr"])["ocr"]
    counts = Counter(r.source for r in real_test_records if built.applies(r.prompt, r.metadata))
    assert counts["pickscore"] == 65 and counts["ocr"] == 1018 and counts.get("drawbench", 0) == 0
