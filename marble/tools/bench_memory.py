"""Peak memory of one benchmarked step, three ways (used by `marble bench step`).

- total: everything the process holds at the peak, weights included (CUDA: the allocator's
  max_memory_allocated; CPU: the RSS high-water mark VmHWM). This is what a cost table of
  "GB per GPU" compares.
- over_weights: total minus what was held once the model and adapters were loaded.
- step: the increase over what was held when the step started (activations, gradients,
  temporaries; the optimizer state only on the step that creates it).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

__all__ = ["MemoryProbe", "fix_malloc"]


def fix_malloc() -> None:
    """Fixed mmap threshold so freed activations go back to the OS (honest RSS deltas)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD; also disables its dynamic growth
    except (OSError, AttributeError):
        pass


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _reset_hwm() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


class MemoryProbe:
    """`loaded()` once after the weights are in memory; `start()` / `peak()` around a step."""

    def __init__(self, device):
        import torch

        self.torch, self.device = torch, device
        self.weights = 0
        self.kind = "cuda_max_memory_allocated"
        if device.type != "cuda":
            self.kind = ("cpu_rss_hwm (VmHWM reset via /proc/self/clear_refs; "
                         "tracemalloc does not see torch allocations)")
            if not _reset_hwm():
                self.kind = "cpu_ru_maxrss (monotonic high-water: later steps read high)"

    def _now(self) -> int:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()
            return self.torch.cuda.memory_allocated()
        if self.kind.startswith("cpu_rss"):
            return _status_kb("VmRSS") * 1024
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def loaded(self) -> float:
        """Record (and return, MB) what the loaded weights hold: the `over_weights` base."""
        self.weights = self._now()
        return self.weights / 2**20

    def start(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()
            self.torch.cuda.reset_peak_memory_stats()  # allocated and reserved peaks
        elif self.kind.startswith("cpu_rss"):
            _reset_hwm()
        self.base = self._now()

    def peak(self) -> dict[str, float]:
        """MB: total, over_weights and step (see the module docstring)."""
        reserved = None
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()
            top = self.torch.cuda.max_memory_allocated()
            # what the caching allocator held at its peak (fragmentation and cache
            # included): the figure nvidia-smi and an out-of-memory error see
            reserved = self.torch.cuda.max_memory_reserved()
        elif self.kind.startswith("cpu_rss"):
            top = _status_kb("VmHWM") * 1024
        else:
            top = self._now()
        mb = 2**20
        return {"total": top / mb, "over_weights": max(top - self.weights, 0) / mb,
                "step": max(top - self.base, 0) / mb,
                "reserved": (reserved if reserved is not None else top) / mb}
