"""The machine a run trained on (issue 47 item 5): CPU model and the kernels torch chose.

Why it is recorded: the claim's answers moved between an Intel Xeon and an AMD EPYC at the same
code and seeds (docs/claim.md "Pre-registration"), since torch picks its CPU kernels (and with
them float summation orders) by the instruction set it finds. train_summary.json carries it and
the claim verdict lists every machine its runs came from. Not in provenance.json: that file is
the same bytes on every host by design (marble.runtime.provenance).
"""

from __future__ import annotations

from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def cpu_model(cpuinfo: str) -> str | None:
    """The first `model name` line's value of a /proc/cpuinfo text, None when there is none
    (an ARM kernel names no model there; macOS has no such file)."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "model name":
            return value.strip() or None
    return None


def machine() -> dict:
    """{"cpu_model", "cpu_capability"}: /proc/cpuinfo's model name and
    torch.backends.cpu.get_cpu_capability() (e.g. AVX2, AVX512); None where unknown."""
    import torch

    try:
        model = cpu_model(CPUINFO.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        model = None
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except (AttributeError, RuntimeError):  # an old torch without the call
        capability = None
    return {"cpu_model": model, "cpu_capability": capability}
