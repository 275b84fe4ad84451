"""The reference's PaddleOCR en models from the reward-checkpoint folder (no download at run time)."""

from __future__ import annotations

import pytest

from marble.rewards import paddle_models
from beds.replicas import paddle_model_tar
from marble.workflow import configs


def test_downloaded_tars_are_extracted_once_into_model_dirs(tmp_path):
    root = tmp_path / paddle_models.FOLDER
    for i, name in enumerate(paddle_models.MODELS.values()):
        paddle_model_tar(root / f"{name}.tar", name, seed=i)
    dirs = paddle_models.model_dirs(tmp_path)
    assert set(dirs) == {"det_model_dir", "rec_model_dir", "cls_model_dir"}
    assert dirs["det_model_dir"].endswith("paddleocr/en_PP-OCRv3_det_infer")
    assert dirs["rec_model_dir"].endswith("paddleocr/en_PP-OCRv4_rec_infer")
    for folder in dirs.values():
        assert (tmp_path / folder / "inference.pdiparams").is_file()
    (root / "en_PP-OCRv4_rec_infer.tar").unlink()  # extracted: the tar is no longer needed
    assert paddle_models.model_dirs(tmp_path) == dirs
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no staging left behind


def test_a_missing_model_names_the_download(tmp_path):
    with pytest.raises(FileNotFoundError, match="marble download rewards --out"):
        paddle_models.model_dirs(tmp_path)


def test_a_tar_without_the_model_is_refused_and_leaves_nothing(tmp_path):
    root = tmp_path / paddle_models.FOLDER
    for name in paddle_models.MODELS.values():
        paddle_model_tar(root / f"{name}.tar", "something_else")
    with pytest.raises(FileNotFoundError, match="not PaddleOCR's model tar"):
        paddle_models.model_dirs(tmp_path)
    assert sorted(p.name for p in root.iterdir()) == sorted(f"{n}.tar" for n in paddle_models.MODELS.values())


def test_paper_presets_and_evaluation_name_the_reference_engine():
    from test_workflow_lib import ROOT

    from marble.config import load_config

    for preset in ("rho_07", "weighted_sum", "equal_alpha"):
        ocr = [r for r in load_config(preset).rewards if r.name == "ocr"]
        assert ocr and dict(ocr[0].options)["backend"] == "paddle", preset
    for cfg in ("config/paper.yaml", "config/table1.yaml", "config/paper-eval.yaml"):
        options = configs.load([cfg], ROOT)["eval"]["reward_options"]
        assert options["ocr"]["backend"] == "paddle", cfg


def test_auto_says_which_engine_it_took(monkeypatch, caplog):
    import importlib.util

    from marble.rewards import ocr

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "rapidocr_onnxruntime" else None)
    with caplog.at_level("WARNING", logger="marble.rewards.ocr"):
        assert ocr.resolve_backend("auto") == "rapidocr_onnxruntime"
    assert "chose 'rapidocr_onnxruntime'" in caplog.text and "not the paper's engine" in caplog.text
    assert ocr.ENGINE_LABELS["paddle"].endswith("the reference's engine")
