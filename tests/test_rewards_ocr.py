"""OCR reward with rapidocr 3.x (PP-OCRv6) on real and rendered text; the scoring maths by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from marble.rewards.ocr import ocr_similarity, resolve_backend

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
    assert resolve_backend("auto") in ("paddle", "rapidocr")  # rapidocr 3.x is installed here


@pytest.fixture(scope="module")
def ocr():
    from marble.rewards import build

    return build("ocr", backend="rapidocr")


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


def test_legacy_ppocrv4_reads_a_spark_as_punctuation(shared_dir):
    """Why rapidocr 3.x comes first: PP-OCRv4 reads "Hello'" (spark -> apostrophe), 1 - 2/10."""
    pytest.importorskip("rapidocr_onnxruntime")
    from marble.rewards import build

    legacy = build("ocr", backend="rapidocr_onnxruntime")
    image = load(shared_dir / "images" / "hello_world.jpg")[None]
    assert legacy(image, ['a sign that says "hello world"'])[0].item() == pytest.approx(0.8)


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
