"""The stored FLOP table the GPU-hour plan reads is current: recounted by the same functions.

marble/workflow/flops_table.json is written by `python -m marble.tools.flops_table --write`
(~20 min at SD3.5M size). Here, in seconds: the tiny shapes are recounted in full; every
SD3.5M-sized entry by its fingerprint (the same count at depth 1), so a change to the
trainer's micro-step, the sampler, the LoRA or the counting itself fails until the table is
regenerated; and every shape the presets and workflow configs of this repository use is in it.
"""

from __future__ import annotations

import pytest
from extras import needs as needs_extra

from marble.config import load_config
from marble.workflow import flops as wf_flops

TABLE = wf_flops.load_table()
ft = pytest.importorskip("marble.tools.flops_table")


def test_every_shape_the_presets_and_configs_use_is_counted():
    needs_extra("torchjd", "zoo")  # the zoo extra: its rows are part of every shape
    needs = ft.needed()
    for key, (_, rows) in needs["micro_step"].items():
        assert set(rows) <= set(TABLE["micro_step"][key]["rows"]), key
    for section in ("rollout", "forward", "vae_decode"):
        assert set(needs[section]) <= set(TABLE[section]), section
    assert set(needs["encoder"]) <= set(TABLE["encoder"])


# One row per code path of the micro-step (plain, diagnostics, amortized, retained and
# recomputed full solves, a torchjd weighting, an advantage-level balancer): all 30 take minutes.
TINY_ROWS = ("weighted_sum", "weighted_sum_diag", "marble_diag", "mgda", "marble_recompute",
             "zoo_upgrad_full", "zoo_upgrad", "gdpo")


def test_tiny_shapes_recount_exactly():
    cfg = load_config("tiny")
    entry = TABLE["micro_step"][wf_flops.micro_key(cfg)]
    rows = TINY_ROWS if "zoo_upgrad" in entry["rows"] else TINY_ROWS[:5]
    assert ft.micro_rows(cfg, rows) == {"rows": {r: entry["rows"][r] for r in rows},
                                        "lora_params": entry["lora_params"]}
    assert ft.rollout_flops(cfg) == TABLE["rollout"][wf_flops.rollout_key(cfg)]["flops"]
    for key, value in TABLE["forward"].items():
        if key.startswith("tiny/"):
            arch, res, text = key.split("/")
            assert ft.forward_flops(arch, int(res[:-2]), int(text[1:])) == value["flops"], key
    assert ft.vae_decode_flops("tiny", 64) == TABLE["vae_decode"]["tiny/64px"]["flops"]


@pytest.mark.parametrize("preset", ["rho_07", "sequential"])
def test_paper_training_shapes_match_their_fingerprints(preset):
    cfg = load_config(preset)
    micro = TABLE["micro_step"][wf_flops.micro_key(cfg)]
    assert ft.fingerprint("micro_step", cfg) == micro["fingerprint"]
    assert micro["rows"]["marble"] == micro["rows"]["weighted_sum"]  # amortized: exactly
    assert ft.fingerprint("rollout", cfg) == TABLE["rollout"][wf_flops.rollout_key(cfg)]["fingerprint"]


def test_evaluated_models_match_their_fingerprints():
    for key, value in TABLE["forward"].items():
        arch, res, text = key.split("/")
        if arch == "tiny":  # recounted in full above (sdxl's fingerprint is its full count)
            continue
        assert ft.fingerprint("forward", (arch, int(res[:-2]), int(text[1:]))) == value["fingerprint"], key
    assert ft.vae_decode_flops("sd3", 512) == TABLE["vae_decode"]["sd3/512px"]["flops"]
    assert ft.encoder_flops("clip_l") == TABLE["encoder"]["clip_l"]["flops"]
