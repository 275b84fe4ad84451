"""Fault: a saved evaluation image replaced at its path, then the evaluation resumes (issue 38).

A resumed `marble evaluate` reloads the PNGs an earlier pass saved (e.g. --no_score, or fewer
rewards) instead of generating them again. It checked the row's prompt, not the file: an image
copied in from another run or checkpoint, or edited, was scored as the sample's. Each row now
records its image's sha256; a file that does not match is regenerated (named in a warning), and
--skip_generation, which asks to score the files that are there, scores it and names it.
"""

from __future__ import annotations

import hashlib
import logging
import shutil

import pytest
from test_evaluate import TOY, count_generated, raw_dir, rows, run_eval, same_scores  # noqa: F401 (fixtures)

THREE = "toy_brightness,toy_saturation,toy_color_match"  # the fourth is left for the --skip_generation pass


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.fault("saved image replaced at its path, then the evaluation resumes")
def test_a_replaced_saved_image_is_regenerated_not_scored(tiny_model_dir, raw_dir, tmp_path,  # noqa: F811
                                                          count_generated, caplog, fault_trials):  # noqa: F811
    out, images = tmp_path / "out", tmp_path / "out" / "images"
    png = ("--image_format", "png", "--limit", 4, "--save_images")
    run_eval(tiny_model_dir, raw_dir, out, "ocr", *png, "--no_score")
    assert count_generated == [2, 2]
    assert [r["image_sha256"] for r in rows(out)] == [sha256(images / f"{i:05d}.png") for i in range(4)]
    shutil.copyfile(images / "00003.png", images / "00001.png")  # another image at sample 1's path
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="marble.evaluation.runner"):
        run_eval(tiny_model_dir, raw_dir, out, "ocr", *png, "--rewards", THREE)
    fault_trials.record(count_generated == [2, 2, 2], f"only the batch of sample 1 regenerated: {count_generated}")
    fault_trials.record("regenerating samples [1]" in caplog.text, f"named: {caplog.text!r}")
    fresh = tmp_path / "fresh"
    run_eval(tiny_model_dir, raw_dir, fresh, "ocr", "--image_format", "png", "--limit", 4, "--rewards", THREE)
    got, want = {r["sample_id"]: r for r in rows(out)}, {r["sample_id"]: r for r in rows(fresh)}
    fault_trials.record(all(same_scores(got[i]["scores"], want[i]["scores"]) for i in range(4)),
                        "every score is the uninterrupted run's")
    fault_trials.record(got[1]["image_sha256"] == sha256(images / "00001.png") != sha256(images / "00003.png"),
                        "sample 1's own image saved again, and its digest recorded")
    # --skip_generation scores the files that are there, and names the one that is not the row's.
    shutil.copyfile(images / "00000.png", images / "00002.png")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="marble.evaluation.runner"):
        run_eval(tiny_model_dir, raw_dir, out, "ocr", *png, "--skip_generation")
    scored = {r["sample_id"]: r for r in rows(out)}
    fault_trials.record(count_generated == [2, 2, 2, 2, 2], "nothing generated under --skip_generation")
    fault_trials.record("--skip_generation: scoring the saved images of samples [2]" in caplog.text,
                        f"named under --skip_generation: {caplog.text!r}")
    fault_trials.record(same_scores(scored[2]["scores"]["toy_brightness"], scored[0]["scores"]["toy_brightness"])
                        and scored[2]["image_sha256"] == sha256(images / "00000.png"),
                        "the file there was scored, and its digest recorded")
    assert not fault_trials.lost, fault_trials.lost
