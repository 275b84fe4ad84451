"""CPU time of the adapter switches of one micro-step, against one no-grad forward.

A micro-step switches three times (old -> disabled -> default, `marble.training.
microstep`): with peft's per-module switching that was ~40 ms of Python each at SD3.5M
size; `marble.models.lora` makes it O(1). Process CPU time, so a GPU's asynchronous
kernels do not hide or inflate it; noisy on a shared CPU machine (a figure, not a test).
"""

from __future__ import annotations

import statistics
import time

__all__ = ["time_adapter_switch"]


def time_adapter_switch(transformer, args: tuple, autocast, repeats: int = 20) -> dict:
    """Median CPU seconds of one micro-step's three switches and of one no-grad forward
    (`args` = velocity's x_t, sigma, prompt_embeds, pooled)."""
    import torch

    from marble.models.encode import velocity
    from marble.models.lora import adapters_disabled, use_adapter

    def switches() -> None:
        with use_adapter(transformer, "old"):
            pass
        with adapters_disabled(transformer):
            pass
        with use_adapter(transformer, "default"):
            pass

    def forward() -> None:
        with torch.no_grad(), autocast():
            velocity(transformer, *args)

    out = {}
    for name, fn, n in (("switches", switches, repeats), ("forward", forward, 3)):
        fn()  # warm-up (installs the shared adapter list on the first switch)
        times = []
        for _ in range(n):
            start = time.process_time()
            fn()
            times.append(time.process_time() - start)
        out[f"{name}_cpu_s"] = statistics.median(times)
    out["ratio_to_forward"] = out["switches_cpu_s"] / max(out["forward_cpu_s"], 1e-12)
    return out
