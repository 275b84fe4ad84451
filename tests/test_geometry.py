"""The batch geometry guard: prompts/images per step against the preset's reference."""

from __future__ import annotations

import re
import shlex

import pytest
from test_workflow_lib import ROOT

from marble.config import ConfigError, load_config
from marble.training.geometry import check_geometry, step_geometry


def test_step_geometry_of_the_reference_and_of_one_node():
    assert step_geometry(16, 9, 8, 24) == (48, 1152)
    assert step_geometry(8, 9, 8, 24) == (24, 576)


def test_one_node_is_refused_without_the_flag_and_named_with_it():
    cfg = load_config("rho_07")
    assert "48 prompts x 24 = 1152 images" in check_geometry(16, cfg.sampling, cfg.train)
    with pytest.raises(ConfigError, match=r"576 images per step.*num_batches_per_epoch=16"):
        check_geometry(8, cfg.sampling, cfg.train)
    allowed = load_config("rho_07", overrides=["train.allow_geometry_change=true"])
    assert "WARNING" in check_geometry(8, allowed.sampling, allowed.train)
    tiny = load_config("tiny")  # no reference geometry: printed only
    assert "WARNING" not in check_geometry(3, tiny.sampling, tiny.train)


def test_the_readme_one_node_command_keeps_the_reference_geometry():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"^torchrun --nproc_per_node (\d+) -m marble\.train (.*?)\n(?!\s)", text,
                      flags=re.MULTILINE | re.DOTALL)
    ranks, rest = int(block.group(1)), shlex.split(block.group(2).replace("\\\n", " "))
    preset = rest[rest.index("--preset") + 1]
    sets = [rest[i + 1] for i, w in enumerate(rest) if w == "--set"]
    cfg = load_config(preset, overrides=sets)
    assert "WARNING" not in check_geometry(ranks, cfg.sampling, cfg.train)
