"""Bitwise comparison of two checkpoint folders, every file they hold (helper, not a test).

A resumed run must reproduce the uninterrupted one in every file: the online and old
adapters (adapters.safetensors), the EMA weights evaluation loads (lora/), the optimizer,
and state.pt (RNG, sampler, balancer, EMA shadow, scaler). Tensor files are compared by
content (torch.equal, dtypes included), the .pt pickles by their loaded values (their
bytes may differ for equal values); COMPLETE holds the other files' hashes, so its file
list is compared rather than its digests.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

COMPLETE = "COMPLETE"


def files_of(ckpt: Path) -> list[str]:
    return sorted(p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*") if p.is_file())


def differences(a, b, where: str) -> list[str]:
    """Paths inside nested dicts / lists / tensors where `a` and `b` differ."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a, b))
        return [] if same else [where]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where}: keys {sorted(map(str, a.keys() ^ b.keys()))}"]
        return [d for k in a for d in differences(a[k], b[k], f"{where}/{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{where}: length {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def _load(path: Path):
    if path.suffix == ".safetensors":
        return load_file(str(path))
    if path.suffix == ".pt":
        return torch.load(path, map_location="cpu", weights_only=True)
    if path.name == COMPLETE:
        marker = json.loads(path.read_text(encoding="utf-8"))
        return {"format": marker.get("format"), "files": sorted(marker.get("sha256", {}))}
    return path.read_bytes()


def assert_same_checkpoint(a: Path, b: Path) -> None:
    """Every file of checkpoint folder `a` equals its counterpart in `b` (and no extras)."""
    names = files_of(a)
    assert names == files_of(b), f"{a.name}: file lists differ: {names} vs {files_of(b)}"
    assert "lora/pytorch_lora_weights.safetensors" in names and "state.pt" in names, names
    bad = [d for rel in names for d in differences(_load(a / rel), _load(b / rel), rel)]
    assert not bad, f"{a.name} differs after resume in: {bad[:10]}"
