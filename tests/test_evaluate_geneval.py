"""`marble evaluate --dataset geneval`: the real GenEval scorer (stand-in detector and colour
classifier behind their interfaces) and the detail/overall bookkeeping."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_evaluate import raw_dir, rows  # noqa: F401  (raw_dir is a fixture)

from marble import evaluate
from marble.evaluation import runner


class FakeGenEval:
    """Stands in for the detector-based reward: per-sample detail from the metadata only.

    Same signature as GenEvalReward.evaluate_detail (images, metadata, strict_only)."""

    def applies(self, prompt, metadata):
        return "include" in metadata

    def evaluate_detail(self, images, metadata, strict_only=False):
        assert images.shape[0] == len(metadata) and not strict_only
        acc = [1.0 if m["tag"] in ("counting", "colors") else 0.0 for m in metadata]
        return [{"score": 0.5 + a / 2, "accuracy": a, "strict_accuracy": a / 2, "tag": m["tag"]}
                for a, m in zip(acc, metadata)]


def test_geneval_detail_and_official_overall(tiny_model_dir, raw_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "build_scorers", lambda specs, device=None: {"geneval": FakeGenEval()})
    out = tmp_path / "geneval"
    argv = ["--model_path", str(tiny_model_dir), "--dataset", "geneval", "--data_dir", str(raw_dir),
            "--output_dir", str(out), "--resolution", "64", "--num_inference_steps", "2", "--batch_size", "3"]
    assert evaluate.main(argv) == 0  # the default reward list for geneval is ["geneval"]
    avg = json.loads((out / "average_scores.json").read_text())
    assert avg["accuracy"] == pytest.approx(2 / 6) and avg["geneval"] == pytest.approx(4 / 6)
    assert avg["counting_accuracy"] == 1.0 and avg["position_accuracy"] == 0.0
    assert avg["geneval_overall"] == pytest.approx(2 / 6) and avg["geneval_tags_present"] == 6
    assert rows(out)[1]["scores"] == {"geneval": 1.0, "accuracy": 1.0, "strict_accuracy": 0.5}


class StandInDetector:
    """The mmdet detector's interface (constructor and `detect`), fixed detections per image:
    two dogs, a cat on the left, a box on the right, a cup. Checks what the reward feeds it."""

    def __init__(self, config: str, ckpt: str, device: str = "cpu"):
        assert Path(config).is_file() and Path(ckpt).is_file()
        self.calls = 0

    def detect(self, images):
        from marble.rewards.geneval_rules import ClassDetections

        out = []
        for image in images:  # HWC uint8 RGB, as the reference hands the detector
            assert image.dtype == np.uint8 and image.shape == (64, 64, 3)
            box = lambda x: np.array([[x, 20, x + 10, 30]], dtype=float)  # noqa: E731
            out.append({"dog": ClassDetections(np.repeat(box(20), 2, 0), np.array([0.95, 0.92])),
                        "cat": ClassDetections(box(0), np.array([0.95])),
                        "box": ClassDetections(box(50), np.array([0.8])),
                        "cup": ClassDetections(box(30), np.array([0.6]))})
        return out


class StandInColors:
    """The CLIP colour classifier's interface: every crop is red."""

    def __init__(self, model: str = "", device: str = "cpu", batch_size: int = 16, ckpt_dir: str | None = None):
        pass

    def __call__(self, image_rgb, objects, classname):
        return ["red"] * len(objects)


def test_real_geneval_scorer_through_evaluate(tiny_model_dir, raw_dir, tmp_path, monkeypatch):
    """`marble evaluate --dataset geneval` with the real GenEvalReward (registry, options, rules);
    only the detector and the colour CLIP are stand-ins behind their interfaces."""
    from marble.rewards import geneval

    monkeypatch.setattr(geneval, "MMDetDetector", StandInDetector)
    monkeypatch.setattr(geneval, "ClipColorClassifier", StandInColors)
    (tmp_path / "det.py").write_text("# detector config stand-in\n")
    (tmp_path / "det.pth").write_bytes(b"weights stand-in")
    options = tmp_path / "options.yaml"
    options.write_text(f"geneval: {{detector_config: {tmp_path / 'det.py'}, detector_ckpt: {tmp_path / 'det.pth'}}}\n")
    out = tmp_path / "geneval"
    argv = ["--model_path", str(tiny_model_dir), "--dataset", "geneval", "--data_dir", str(raw_dir),
            "--output_dir", str(out), "--resolution", "64", "--num_inference_steps", "2", "--batch_size", "4",
            "--reward_options", str(options)]
    assert evaluate.main(argv) == 0
    # By hand (GENEVAL order): red cat 1/1/1; two dogs 1/1/1; blue car (none) 0; bird 0;
    # cup and pen: credits [1, 0] -> 0.5; box left of cat: box is right -> [1, 1, 0, 1] = 0.75.
    expected = [(1.0, 1.0, 1.0), (1.0, 1.0, 1.0), (0.0, 0.0, 0.0), (0.0, 0.0, 0.0), (0.5, 0.0, 0.0),
                (0.75, 0.0, 0.0)]
    got = [(r["scores"]["geneval"], r["scores"]["strict_accuracy"], r["scores"]["accuracy"]) for r in rows(out)]
    assert got == expected
    avg = json.loads((out / "average_scores.json").read_text())
    assert avg["geneval"] == pytest.approx(3.25 / 6) and avg["accuracy"] == pytest.approx(2 / 6)
    assert avg["geneval_overall"] == pytest.approx(2 / 6) and avg["color_attr_accuracy"] == 1.0
