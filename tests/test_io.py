"""marble.runtime.io: atomic writes and the JSONL reader shared by metrics and evaluation logs."""

import json

import pytest

from marble.rewards import applicability
from marble.runtime.io import append_jsonl, read_jsonl, write_json


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


def test_read_jsonl_input_files_allow_no_torn_tail_and_must_be_utf8(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": "b"')
    with pytest.warns(UserWarning, match="torn last line"):  # a log: the crash excuse holds
        assert [r for _, r in read_jsonl(path)] == [{"prompt": "a"}]
    with pytest.raises(ValueError, match=r"prompts.jsonl:2: invalid JSON line"):
        read_jsonl(path, torn_tail=False)
    path.write_bytes(b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=r"prompts.jsonl: not UTF-8 text"):
        read_jsonl(path)


def test_metrics_truncation_reads_through_read_jsonl(tmp_path):
    """A torn *last* line is dropped and counted; a bad line elsewhere is an error naming it
    (it used to be dropped silently, losing a logged step)."""
    from marble.training.metrics import MetricsLog

    log = MetricsLog(tmp_path / "metrics.jsonl")
    for step in (1, 2, 3):
        log.log({"step": step})
    with open(log.path, "a") as fh:
        fh.write('{"step": 4, "lo')
    with pytest.warns(UserWarning, match="torn last line"):
        assert log.truncate_after(2) == 2
    assert log.path.read_text() == '{"step": 1}\n{"step": 2}\n'
    log.path.write_text('{"step": 1}\n{"ste\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: invalid JSON line"):
        log.truncate_after(1)


def test_report_reads_eval_results_and_jpg_images(tmp_path):
    """The report's eval-sample reader: .jpg images (evaluate's default) as well as .png, and
    a torn last results line (a killed evaluation) skipped as everywhere else."""
    from PIL import Image

    from marble.report.loading import eval_samples

    ds = tmp_path / "eval" / "run" / "checkpoint-000010" / "ocr"
    (ds / "images").mkdir(parents=True)
    for i, ext in enumerate(["jpg", "jpg", "png"]):
        Image.new("RGB", (8, 8)).save(ds / "images" / f"{i:05d}.{ext}")
    lines = [json.dumps({"sample_id": i, "prompt": f"p{i}", "scores": {"r": i, "s": None},
                         "image_path": str(ds / "images" / f"{i:05d}.jpg")}) for i in range(2)]
    (ds / "evaluation_results.jsonl").write_text("\n".join(lines) + '\n{"sample_id": 2, "pro')
    with pytest.warns(UserWarning, match="torn last line"):
        samples = eval_samples(tmp_path / "eval", "run", limit=5)["ocr"]
    assert [s.image_path.name for s in samples] == ["00000.jpg", "00001.jpg", "00002.png"]
    assert [(s.prompt, s.scores) for s in samples] == [("p0", {"r": 0.0}), ("p1", {"r": 1.0}), ("", {})]
