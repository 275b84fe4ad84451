"""The gpu check's profile phase: GPU-busy fraction and device syncs of real micro-steps.

One amortized MARBLE micro-step and one full solve of the preset's model (loaded as
training loads it, `marble.models.policy`) on a synthetic batch:
- host syncs: on CUDA `torch.cuda.set_sync_debug_mode("warn")` counts the synchronizing
  calls torch itself reports; on the CPU (`--tiny`) `HostSyncCounter` counts host reads;
- GPU-busy fraction: device time of the kernels `torch.profiler` records over the
  amortized micro-step, divided by its wall time (CUDA only; None on the CPU).
"""

from __future__ import annotations

import time
import warnings

__all__ = ["profile_micro_steps"]


def _cuda_syncs(fn) -> int:
    import torch

    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
            torch.cuda.synchronize()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message) for w in caught)


def _busy_fraction(fn) -> float:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    device_us = sum(getattr(e, "self_device_time_total", 0.0) for e in prof.key_averages())
    return device_us / 1e6 / wall


def profile_micro_steps(cfg, device: str, model_path: str | None = None) -> dict:
    """{"amortized": {...}, "full_solve": {...}}: syncs per micro-step, busy fraction."""
    import dataclasses

    import torch

    from marble.models.policy import load_policy
    from marble.runtime.precision import make_precision
    from marble.tools.bench import make_balancers, synthetic_batch
    from marble.tools.counting import HostSyncCounter
    from marble.tools.micro_step_call import one_micro_step

    dev = torch.device(device)
    mp = cfg.model.mixed_precision if dev.type == "cuda" else "no"
    pipe, params = load_policy(dataclasses.replace(cfg.model, mixed_precision=mp),
                               cfg.train.seed, dev, text_encoders=False, path=model_path)
    precision = make_precision(mp, dev)
    batch = synthetic_batch(pipe, cfg, dev, seed=cfg.train.seed)
    bals = make_balancers(cfg, ("marble", "mgda"))
    out = {}
    for name, row in (("amortized", "marble"), ("full_solve", "mgda")):
        def step(bal=bals[row]):
            one_micro_step(pipe, cfg, batch, bal, params, precision)
        step()  # warm-up (kernels, allocator, the shared adapter list)
        if dev.type == "cuda":
            out[name] = {"device_syncs": _cuda_syncs(step), "sync_kind": "cuda_sync_debug",
                         "gpu_busy_fraction": _busy_fraction(step)}
        else:
            with HostSyncCounter() as count:
                step()
            out[name] = {"device_syncs": count.total, "sync_kind": "host_reads_cpu",
                         "gpu_busy_fraction": None}
        for p in params:
            p.grad = None
    return out
