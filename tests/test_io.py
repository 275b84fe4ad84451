"""marble.io: atomic writes and the JSONL reader shared by metrics and evaluation logs."""

import json

import pytest

from marble.io import append_jsonl, read_jsonl, write_json
from marble.rewards import applicability


def test_read_jsonl_skips_blank_lines_and_a_torn_tail(tmp_path):
    path = tmp_path / "log.jsonl"
    append_jsonl(path, {"step": 1})
    with open(path, "a") as fh:
        fh.write("\n")  # a blank line must not shift the torn-tail check
    append_jsonl(path, {"step": 2})
    with open(path, "a") as fh:
        fh.write('{"step": 3, "lo')
    with pytest.warns(UserWarning, match=r"log.jsonl:4: ignoring a torn last line"):
        rows = read_jsonl(path)
    assert rows == [(1, {"step": 1}), (3, {"step": 2})]


def test_read_jsonl_names_a_bad_middle_line(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(KeyError, match=r"log.jsonl:2: invalid JSON line"):
        read_jsonl(path, KeyError)


def test_write_json_replaces_atomically(tmp_path):
    path = tmp_path / "a" / "x.json"
    write_json(path, {"a": 1})
    write_json(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    assert [p.name for p in path.parent.iterdir()] == ["x.json"]  # no temp left behind


def test_applicability_needs_no_weights_and_honours_overrides():
    ocr = applicability("ocr")  # the real OCR class; no engine is loaded
    assert ocr.applies('a sign that says "hi"', {}) and not ocr.applies("a cat", {})
    only_ocr_source = applicability("pickscore", applies_to=["ocr"])
    assert only_ocr_source.applies("a cat", {"source": "ocr"})
    assert not only_ocr_source.applies("a cat", {"source": "pickscore"})
    with pytest.raises(KeyError, match="unknown reward 'nope'"):
        applicability("nope")
