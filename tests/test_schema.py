"""Typed reads (issue 38 item 4): one pure check per kind of boundary value, against hand-made
values; each error names the place and the key in one line."""

from __future__ import annotations

import numpy as np
import pytest

from marble.runtime.schema import (SchemaError, check_json_object, check_mask_value, check_metrics_line,
                                   check_prompt_text, check_result_row, prompt_text_problem)


@pytest.mark.parametrize("text,said", [
    ("\ufeffa cat", "byte-order mark (U+FEFF) at character 1"),
    ("a\x00cat", "control character '\\x00' (U+0000) at character 2"),
    ("a \x1b[31mcat", "U+001B"),
    ("a\u2028cat", "line separator"),
    ("a\x85cat", "U+0085"),
    ("a\ufeffcat\x07", "U+0007) at character 6"),
    ("   ", "empty prompt"),
])
def test_a_prompt_with_an_invisible_character_is_refused(text, said):
    assert said in prompt_text_problem(text)
    with pytest.raises(SchemaError, match="f.txt:3: `prompt`") as err:
        check_prompt_text(text, "f.txt:3")
    assert "\n" not in str(err.value)


def test_ordinary_prompts_pass_tabs_and_accents_included():
    # U+FEFF inside a prompt is upstream text (pickscore/train.txt holds 4), kept as the reference reads it
    for text in ("a cat", "a café\tat night", "「猫」", "emoji 🐱", "a cat,\ufeff on a mat"):
        assert prompt_text_problem(text) is None and check_prompt_text(text, "x") == text
    with pytest.raises(SchemaError, match="must be text, got int 5"):
        check_prompt_text(5, "x")


def test_a_mask_cell_is_a_real_boolean():
    assert check_mask_value(True, "t: row 0", "applies__ocr") is True
    assert check_mask_value(np.bool_(False), "t: row 0", "applies__ocr") is False
    for value in ("False", 0, None, float("nan")):
        with pytest.raises(SchemaError, match="t: row 4: `applies__ocr` must be true or false"):
            check_mask_value(value, "t: row 4", "applies__ocr")


def test_metadata_is_a_json_object():
    assert check_json_object('{"tag": "counting"}', "w", "metadata") == {"tag": "counting"}
    for value, said in [("not json", "is not JSON"), ("[1]", "must be a JSON object, got list"),
                        (None, "as text, got NoneType")]:
        with pytest.raises(SchemaError, match=said):
            check_json_object(value, "w", "metadata")


def test_a_metrics_line_holds_numbers_under_numeric_keys():
    good = {"step": 3, "reward/ocr": 0.5, "loss": None, "balancer": "marble", "skipped": False,
            "diag_micro": [{"micro": 0}], "grad_norm": float("nan")}
    assert check_metrics_line(good, "m:1") is good
    for record, said in [({"step": 1, "reward/ocr": "0.7"}, "m:2: `reward/ocr` = '0.7' is not a number"),
                         ({"step": "1"}, "m:2: `step` must be an integer >= 0"),
                         ({"step": True}, "`step` must be an integer"),
                         ({"reward/ocr": 1.0}, "with a `step` key"),
                         ([1, 2], "expected a JSON object"),
                         ({"step": 1, "balancer": 3}, "`balancer` must be text")]:
        with pytest.raises(SchemaError, match=said.replace("(", r"\(")):
            check_metrics_line(record, "m:2")


def test_a_results_row_has_typed_fields():
    row = {"sample_id": 0, "rev": 2, "prompt_id": "ab", "prompt": "a cat", "metadata": {"tag": "x"},
           "scores": {"ocr": 1.0}, "not_applicable": ["pickscore"], "failed": [], "image_path": None}
    assert check_result_row(row, "r:1") is row
    assert check_result_row({"sample_id": 0, "scores": {}}, "r:1")  # a row of an earlier release
    for key, value in [("not_applicable", "pickscore,ocr"), ("failed", [1]), ("rev", 0), ("prompt", 5),
                       ("metadata", "tag"), ("image_path", 3), ("scores", [1.0])]:
        with pytest.raises(SchemaError, match=f"r:7: `{key}`"):
            check_result_row({**row, key: value}, "r:7")


def test_a_table_of_to_frame_passes_and_a_string_mask_does_not(tmp_path):
    from marble.data.records import DataError, PromptRecord, load_table, to_frame

    df = to_frame([PromptRecord.make("a cat", "pickscore"), PromptRecord.make("a\tdog", "ocr")],
                  {"ocr": [False, True]})
    df.to_parquet(tmp_path / "t.parquet")
    assert load_table(tmp_path / "t.parquet")["applies__ocr"].tolist() == [False, True]
    df["applies__ocr"] = ["False", "True"]
    df.to_parquet(tmp_path / "t.parquet")
    with pytest.raises(DataError, match=r"t.parquet: row 0: `applies__ocr` must be true or false, got str"):
        load_table(tmp_path / "t.parquet")
