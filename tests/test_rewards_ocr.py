"""OCR reward with the offline ONNX backends (rapidocr-onnxruntime PP-OCRv4, rapidocr 3.x PP-OCRv6) on
real and rendered text; the scoring maths and the reference's target rule by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from marble.rewards.base import quoted_target, reference_quoted_target
from marble.rewards.ocr import ocr_similarity, require_paddleocr_2, resolve_backend

pytest.importorskip("rapidocr")
pytest.importorskip("Levenshtein")


def test_similarity_by_hand():
    assert ocr_similarity("Hello World!", "hello world") == 1.0  # substring after normalising
    assert ocr_similarity("hallo", "hello") == pytest.approx(0.8)  # one substitution
    assert ocr_similarity("", "abc") == 0.0  # distance 3 capped at len 3
    assert ocr_similarity("completely different text", "ab") == 0.0  # capped, never negative
    assert ocr_similarity("HELLO'WORLD!", "hello world") == pytest.approx(0.8)  # 2 edits / 10
    with pytest.raises(ValueError):
        resolve_backend("tesseract")
    assert resolve_backend("rapidocr_onnxruntime") == "rapidocr_onnxruntime"
    assert resolve_backend("auto") in ("paddle", "rapidocr_onnxruntime")  # the paper's PP-OCRv4 family first


def test_auto_prefers_ppocrv4_over_ppocrv6(monkeypatch):
    import importlib.util

    present = {"rapidocr", "rapidocr_onnxruntime"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name in present else None)
    assert resolve_backend("auto") == "rapidocr_onnxruntime"
    present.add("paddleocr")
    assert resolve_backend("auto") == "paddle"
    present.clear()
    present.add("rapidocr")
    assert resolve_backend("auto") == "rapidocr"


def test_paddle_backend_requires_the_2x_api():
    require_paddleocr_2("2.9.1")
    require_paddleocr_2("2.10.0")
    with pytest.raises(ImportError, match="2.x API.*3.0.1"):
        require_paddleocr_2("3.0.1")


def test_reference_target_rule_by_hand():
    assert reference_quoted_target('a sign "hello world" and "x"') == "hello world"
    assert reference_quoted_target('a slushy cup with \'SDXL" written on it') == " written on it"  # unterminated
    assert reference_quoted_target('""portrait", a painting') is None  # first span empty: NaN in the reference
    assert reference_quoted_target("no quotes") is None
    assert reference_quoted_target('spaces " " only') is None  # the reference divides by zero here


def test_default_target_rule_is_the_first_non_empty_quoted_span():
    """marble's own rule (reference_rules off): the FIRST non-empty "..." span, by hand."""
    assert quoted_target('a sign "hello world" and a banner "x"') == "hello world"
    assert quoted_target('"open" now, "closed" later, "gone" soon') == "open"
    assert quoted_target('a " " gap, then "late"') == "late"  # a spaces-only span is empty
    assert quoted_target("no quotes") is None and quoted_target('one "unterminated') is None


def test_reference_rules_change_the_mask_without_weights():
    from marble.rewards import applicability

    prompt = '""Gif Co"" written in sea shells'  # a real pickscore train prompt
    assert applicability("ocr").applies(prompt, {})
    assert not applicability("ocr", options={"reference_rules": True, "backend": "paddle"}).applies(prompt, {})


@pytest.fixture(scope="module")
def ocr():
    from marble.rewards import build

    return build("ocr", backend="rapidocr")


@pytest.fixture(scope="module")
def ocr_v4():
    pytest.importorskip("rapidocr_onnxruntime")
    from marble.rewards import build

    return build("ocr", backend="rapidocr_onnxruntime", reference_rules=True)


def load(path) -> torch.Tensor:
    from PIL import Image

    return torch.from_numpy(np.array(Image.open(path).convert("RGB"))).permute(2, 0, 1).float() / 255


def render(text: str) -> torch.Tensor:
    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", (512, 256), "white")
    ImageDraw.Draw(img).text((30, 80), text, fill="black", font=ImageFont.load_default(size=72))
    return torch.from_numpy(np.array(img)).permute(2, 0, 1).float() / 255


def test_hello_world_photo(ocr, shared_dir):
    image = load(shared_dir / "images" / "hello_world.jpg")[None].repeat(3, 1, 1, 1)
    prompts = ['a sign that says "hello world"', 'a sign that says "goodbye moon"', "a sign without quotes"]
    out = ocr(image, prompts)
    assert out[0].item() >= 0.9  # PP-OCRv6 reads "Hello" "World!"
    assert out[1].item() < out[0].item() - 0.3
    assert math.isnan(out[2].item())
    assert ocr.failures == 0 and ocr.errors == 0


def test_ppocrv4_reads_a_spark_as_punctuation(ocr_v4, shared_dir):
    """The paper's recogniser family: PP-OCRv4 reads "Hello'World!" (spark -> apostrophe), 1 - 2/10."""
    image = load(shared_dir / "images" / "hello_world.jpg")[None].repeat(2, 1, 1, 1)
    out = ocr_v4(image, ['New York Skyline with "Hello World" written with fireworks', 'a "goodbye moon'])
    assert out[0].item() == pytest.approx(0.8)
    assert out[1].item() < 0.5  # unterminated quote: the reference still scores "goodbye moon"


def test_images_reach_the_engine_as_rgb(ocr_v4, monkeypatch):
    seen = []

    class Recorder:
        def read(self, image):
            seen.append(image)
            return "hello"

    monkeypatch.setattr(ocr_v4, "engine", Recorder())
    image = torch.zeros(1, 3, 4, 4)
    image[0, 0] = 1.0  # pure red
    assert ocr_v4(image, ['"hello"'])[0].item() == 1.0
    assert seen[0][0, 0].tolist() == [255, 0, 0]  # RGB order, as the reference passes np.array(PIL)


def test_reference_rules_score_an_engine_error_zero(ocr_v4, monkeypatch):
    def broken(image):
        raise RuntimeError("paddle exploded")

    monkeypatch.setattr(ocr_v4, "read", broken)
    before = ocr_v4.errors
    out = ocr_v4(torch.zeros(2, 3, 8, 8), ['"hello"', "no quote"])
    assert out[0].item() == 0.0 and math.isnan(out[1].item())  # the reference's maximum penalty
    assert ocr_v4.errors == before + 1


def test_rendered_text(ocr):
    images = torch.stack([render("MARBLE 2026"), render("MARBLE 2026")])
    out = ocr(images, ['a poster reading "marble 2026"', 'a poster reading "diffusion"'])
    assert out[0].item() >= 0.9
    assert out[1].item() < 0.5


def test_engine_crash_is_nan_and_counted(ocr, monkeypatch):
    calls = []

    def flaky(image):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("onnx exploded")
        return "hello"

    monkeypatch.setattr(ocr, "read", flaky)
    before = ocr.failures
    out = ocr(torch.zeros(2, 3, 8, 8), ['"hello"', '"hello"'])
    assert math.isnan(out[0].item()) and out[1].item() == 1.0
    assert ocr.failures == before + 1 and ocr.errors >= 1


def test_paper_presets_use_the_reference_rules():
    from marble.config import available_presets, load_config

    for name in available_presets():
        specs = {r.name: r for r in load_config(name).rewards}
        if "ocr" in specs:
            assert specs["ocr"].options.get("reference_rules") is True, name
