"""Log noise (issue 41 item 5): the text encoders' truncation warning once per process, not
once per encode_prompt call; no torchvision fallback warning when diffusers loads SD3."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import warnings

import pytest

from marble.models import log_filters

TRUNCATED = ("The following part of your input was truncated because `max_sequence_length` is set to "
             " 32 tokens: ['', '']")


class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def sd3_logger():
    """The SD3 pipeline's logger with a fresh filter and a recording handler."""
    logger = logging.getLogger(log_filters.SD3_LOGGER)
    saved = list(logger.filters)
    logger.filters = [log_filters.FirstTruncationOnly()]
    handler = Records()
    logger.addHandler(handler)
    yield logger, handler
    logger.removeHandler(handler)
    logger.filters = saved


def test_truncation_warning_passes_once_reworded(sd3_logger):
    logger, handler = sd3_logger
    for _ in range(67):
        logger.warning(TRUNCATED)
    logger.warning("another warning")
    assert len(handler.messages) == 2, handler.messages
    assert "model.max_sequence_length" in handler.messages[0] and "['', '']" not in handler.messages[0]
    assert handler.messages[1] == "another warning"  # other warnings untouched


def test_install_is_idempotent_and_drops_the_torchvision_fallback():
    log_filters.install()
    log_filters.install()
    logger = logging.getLogger(log_filters.IMPORT_LOGGER)
    assert sum(isinstance(f, log_filters.DropTorchvisionFallback) for f in logger.filters) == 1
    handler = Records()
    logger.addHandler(handler)
    try:
        logger.warning("`CLIPImageProcessor` requires torchvision (not installed); falling back to "
                       "`CLIPImageProcessorPil` for backward compatibility.")
        logger.warning("something else")
    finally:
        logger.removeHandler(handler)
    assert handler.messages == ["something else"]


def test_the_text_encoder_lora_message_is_dropped_and_nothing_else():
    log_filters.install()
    logger = logging.getLogger(log_filters.LORA_TEXT_ENCODER_LOGGER)
    handler = Records()
    logger.addHandler(handler)
    try:
        for prefix in ("text_encoder", "text_encoder_2"):
            logger.warning(f"No LoRA keys associated to CLIPTextModelWithProjection found with the {prefix=}. "
                           "This is safe to ignore if LoRA state dict didn't originally have any ...")
        logger.warning("Loading adapter weights from state_dict led to unexpected keys")
    finally:
        logger.removeHandler(handler)
    assert handler.messages == ["Loading adapter weights from state_dict led to unexpected keys"]


# A fresh process, as a training job is one: diffusers imported through marble.models, the
# tiny pipeline encoding over-long prompts three times (a training log called it 67 times),
# then a transformer-only LoRA loaded as `marble evaluate` loads a checkpoint.
SCRIPT = textwrap.dedent("""
    import tempfile
    from marble.models import (add_lora_adapters, build_tiny_pipeline, encode_prompts,
                               load_lora_into_pipeline, save_lora_diffusers)
    pipe = build_tiny_pipeline()
    long = ["a red cube on a blue sphere beside a green cone " * 8] * 2
    for _ in range(3):
        encode_prompts(pipe, long, 32)
    # a LoRA of the transformer alone, loaded as an evaluation loads one
    add_lora_adapters(pipe.transformer, 2, 2.0, ["to_q", "to_k"], seed=0)
    folder = tempfile.mkdtemp()
    save_lora_diffusers(pipe.transformer, folder)
    load_lora_into_pipeline(build_tiny_pipeline(), folder)
""")


def test_a_process_encoding_long_prompts_and_loading_a_lora_warns_once():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = proc.stdout + proc.stderr
    assert "requires torchvision" not in log, log[-3000:]
    assert log.count(log_filters.TRUNCATION) == 0, log[-3000:]
    assert log.count("are truncated") == 1, log[-3000:]
    assert "No LoRA keys" not in log, log[-3000:]


def test_pyproject_builds_without_a_setuptools_deprecation(tmp_path):
    """`pip install -e .` printed setuptools' `project.license` table deprecation: the
    licence is an SPDX string (setuptools >= 77, the build requirement)."""
    from pathlib import Path

    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "pyproject.toml").write_text((root / "pyproject.toml").read_text())
    (tmp_path / "README.md").write_text("")
    (tmp_path / "marble").mkdir()
    (tmp_path / "marble" / "__init__.py").write_text("")
    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings():
        mp.chdir(tmp_path)
        warnings.simplefilter("error")  # any deprecation setuptools raises fails the test
        dist = apply_configuration(Distribution(), "pyproject.toml")
    assert dist.metadata.license_expression == "Apache-2.0"
