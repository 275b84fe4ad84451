"""Each zoo balancer family trains on the tiny SD3 and resumes bitwise after a kill: the
Gramian family (Nash-MTL, the stateful one: a solve right after the resume warm-starts from
the checkpointed state) and the advantage-level one (GDPO). The harness and settings are
test_trainer's `test_resume_is_bitwise`, one step shorter: 3 steps straight vs 2 + a kill's
debris + 1, the resumed step a solve (amortize_every = 2)."""

from __future__ import annotations

import json

import pytest
from extras import needs
from checkpoint_compare import assert_same_checkpoint
from test_trainer import read_metrics, small_args, table_path  # noqa: F401 (fixture)

from marble.train import main as train_main
from marble.training.checkpoint import checkpoint_dir

FAMILIES = {
    "gramian": ("gramian", ("balancer.weighting=nash_mtl",)),
    "advantage": ("gdpo", ()),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_zoo_family_trains_and_resumes_bitwise(family, tiny_model_dir, table_path, tmp_path):  # noqa: F811
    if family == "gramian":
        needs("torchjd", "zoo")
    method, extra = FAMILIES[family]
    argv = small_args(tiny_model_dir, table_path, tmp_path / "straight", method, extra=extra)
    assert train_main(argv + ["--max-steps", "3"]) == 0
    resumed = small_args(tiny_model_dir, table_path, tmp_path / "resumed", method, extra=extra)
    assert train_main(resumed + ["--max-steps", "2"]) == 0
    with open(tmp_path / "resumed" / "metrics.jsonl", "a") as fh:  # what a kill leaves
        fh.write(json.dumps({"step": 3, "stale": True}) + "\n" + '{"step": 4, "lo')
    (tmp_path / "resumed" / "checkpoints" / "checkpoint-000003").mkdir()
    assert train_main(resumed + ["--max-steps", "3"]) == 0
    assert_same_checkpoint(checkpoint_dir(tmp_path / "straight", 3),
                           checkpoint_dir(tmp_path / "resumed", 3))
    ma, mb = read_metrics(tmp_path / "straight"), read_metrics(tmp_path / "resumed")
    assert [r["step"] for r in mb] == [1, 2, 3] and all(r["balancer"] == method for r in mb)
    # amortize_every = 2: solves at steps 0 and 2 (metrics steps 1 and 3), cached in between
    if method == "gramian":
        assert [r["full_solve"] > 0 for r in ma] == [True, False, True]
    for ra, rb in zip(ma, mb):
        assert ra["loss/policy"] == rb["loss/policy"] and ra["grad_norm"] == rb["grad_norm"]
