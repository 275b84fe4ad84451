"""No host reads inside a training micro-step (issue 19): counted on the CPU plumbing.

`HostSyncCounter` patches the Tensor methods that copy a value to the host (`.item()`,
`float(t)`, `.tolist()`, `.cpu()`, ...); each is a device sync on a GPU. Before this
change an amortized micro-step did 4 (2 balancer metrics + 2 logged losses) and a full
solve 35 on the tiny model (~550 at SD3.5M size: float64 dots in 1M-entry chunks, the
Gram element by element). Now: none in an amortized step, one (the K x K Gram for the
QP) in a full solve, diagnostics included, and one per device when the optimizer step
reads the accumulated metrics.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from marble.config import load_config
from marble.tools.counting import HostSyncCounter

OVERRIDES = ["sampling.resolution=32", "train.batch_size=3", "model.path=random:tiny"]


@pytest.fixture(scope="module")
def setup():
    from marble.models import load_pipeline
    from marble.models.lora import add_lora_adapters, trainable_lora_parameters
    from marble.tools.bench import synthetic_batch

    cfg = load_config("tiny", overrides=OVERRIDES)
    pipe = load_pipeline("random:tiny", dtype=torch.float32, device=torch.device("cpu"))
    add_lora_adapters(pipe.transformer, rank=2, alpha=4, targets=cfg.model.lora_targets, seed=0)
    params = trainable_lora_parameters(pipe.transformer)
    return cfg, pipe, params, synthetic_batch(pipe, cfg, torch.device("cpu"), seed=0)


def _balancer(cfg, method, diagnostics, amortized):
    from marble.balancers import build_balancer

    bcfg = dataclasses.replace(cfg.balancer, method=method, diagnostics_every=diagnostics,
                               amortize_every=10**9 if amortized else 1, warmup_steps=0)
    bal = build_balancer(bcfg, cfg.reward_names)
    if amortized:
        k = len(cfg.reward_names)
        bal.load_state_dict({"method": method, "reward_names": cfg.reward_names,
                             "alpha_cache": list(np.full(k, 1.0 / k)), "last_full": 0,
                             "last_alpha": None})
    return bal


# (method, diagnostics_every, amortized, full_solve mode) -> host reads in one micro-step
CASES = [
    # diagnostics: the fresh solve on the step's gradients reads its Gram for the QP (issue 26)
    ("weighted_sum", 1, False, "retain", 1),
    ("marble", 0, True, "retain", 0),  # the amortized step
    ("marble", 1, True, "retain", 1),
    ("marble", 0, False, "recompute", 1),  # a full solve: the Gram read for the QP
    ("mgda", 1, False, "retain", 1),
]


@pytest.mark.parametrize("method,diag,amortized,mode,expected", CASES)
def test_micro_step_reads_nothing_back_but_the_qp_gram(setup, method, diag, amortized, mode,
                                                       expected):
    from marble.tools.micro_step_call import one_micro_step
    from marble.training.metrics import StepAverager
    from marble.training.trainer import autocast_factory

    cfg, pipe, params, batch = setup
    cfg = dataclasses.replace(cfg, balancer=dataclasses.replace(cfg.balancer, full_solve=mode))
    bal = _balancer(cfg, method, diag, amortized)
    averager = StepAverager()
    for p in params:
        p.grad = None
    with HostSyncCounter() as count:
        metrics = one_micro_step(pipe, cfg, batch, bal, params,
                                 autocast_factory("no", torch.device("cpu")), micro_index=0)
        averager.add(metrics)
    assert metrics["full_solve"] == float(not amortized and method != "weighted_sum")
    assert count.total == expected, dict(count.by_method)
    with HostSyncCounter() as at_step:
        out = averager.result()
    assert at_step.total == 1 and np.isfinite(out["loss/policy"])  # one read, all metrics


def test_counter_sees_each_kind_of_host_read():
    t = torch.arange(3.0)
    with HostSyncCounter() as c:
        float(t[0]), t[1].item(), t.tolist(), t.cpu(), int(t[2]), bool(t[0]), np.asarray(t)
    assert c.total == 7 and set(c.by_method) == {"__float__", "item", "tolist", "cpu",
                                                 "__int__", "__bool__", "__array__"}
    assert float(t[1]) == 1.0  # restored: no count outside the block
    assert c.total == 7
