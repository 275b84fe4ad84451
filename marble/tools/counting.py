"""Deterministic counters for `marble bench flops` and the sync tests.

- `HostSyncCounter`: counts the Tensor methods that read a value back to the host
  (`.item()`, `float(t)`, `.tolist()`, `.cpu()`, ...). On a GPU each is a device sync; on
  the CPU the same calls are counted, so CI sees the syncs a GPU run would pay.
- `LiveTensorMemory`: the bytes of live tensor storages, and their peak, tracked per
  storage through a dispatch mode (works on meta / fake tensors, which have no
  allocator). Tensors alive before it starts are added with `track`.
- `PassCounter`: forward calls of a module (with / without grad) and backward passes
  through it.
- `flop_counter`: torch's FlopCounterMode that also counts the in-place matmuls (`addmm_`,
  `baddbmm_`), which torch's registry leaves at 0 (the balancers' float64 Gram is `addmm_`).
"""

from __future__ import annotations

import contextlib
import weakref
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["HostSyncCounter", "LiveTensorMemory", "PassCounter", "flop_counter"]

def _addmm_inplace_flop(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """self += a @ b: 2 m k n, as torch counts the out-of-place `addmm` (the add is not
    counted, as for every elementwise op)."""
    *batch, m, k = a_shape
    n = b_shape[-1]
    return 2 * m * k * n * (batch[0] if batch else 1)


def flop_counter():
    """FlopCounterMode(display=False) with the in-place matmuls counted: torch's registry maps
    aten.addmm and aten.baddbmm but not their in-place forms, which would count 0 FLOPs."""
    from torch.utils.flop_counter import FlopCounterMode

    ops = torch.ops.aten
    return FlopCounterMode(display=False, custom_mapping={ops.addmm_: _addmm_inplace_flop,
                                                           ops.baddbmm_: _addmm_inplace_flop})


# Tensor methods that copy a value to the host (each one blocks on the device).
SYNC_METHODS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__",
                "__index__", "__array__")


class HostSyncCounter(contextlib.AbstractContextManager):
    """`with HostSyncCounter() as c: ...` -> c.total, c.by_method (a Counter).

    Patches the methods on torch.Tensor for the duration and counts each outermost
    call (a method calling another, e.g. `__float__` -> `item`, counts once)."""

    def __init__(self):
        self.by_method: Counter = Counter()
        self._saved: dict = {}
        self._depth = 0

    @property
    def total(self) -> int:
        return sum(self.by_method.values())

    def _wrap(self, name, original):
        def counted(tensor, *args, **kwargs):
            if self._depth == 0:
                self.by_method[name] += 1
            self._depth += 1
            try:
                return original(tensor, *args, **kwargs)
            finally:
                self._depth -= 1
        return counted

    def __enter__(self):
        for name in SYNC_METHODS:
            original = getattr(torch.Tensor, name)
            self._saved[name] = torch.Tensor.__dict__.get(name, None)
            setattr(torch.Tensor, name, self._wrap(name, original))
        return self

    def __exit__(self, *exc):
        for name, saved in self._saved.items():
            if saved is None:
                delattr(torch.Tensor, name)  # inherited from the C base class
            else:
                setattr(torch.Tensor, name, saved)
        self._saved.clear()
        return False


def _storage_of(t: torch.Tensor):
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # e.g. a sparse or nested tensor
        return None


class LiveTensorMemory(TorchDispatchMode):
    """Bytes held by live tensor storages seen by the dispatcher, and the peak.

    A storage counts once however many views share it, from the op that creates it
    until it is freed (a weakref callback on the storage). `reset_peak()` starts a new
    peak from what is live now."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, int] = {}
        self.current = 0
        self.peak = 0

    def track(self, tensors) -> None:
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self._add(t)

    def reset_peak(self) -> None:
        self.peak = self.current

    def _add(self, t: torch.Tensor) -> None:
        st = _storage_of(t)
        if st is None:
            return
        key = st._cdata
        if key in self.live:
            return
        nbytes = st.nbytes()
        self.live[key] = nbytes
        self.current += nbytes
        self.peak = max(self.peak, self.current)
        weakref.finalize(st, self._free, key)

    def _free(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._add(t)
        return out


class PassCounter:
    """Forward calls of `module` (split by grad mode) and backward passes through it."""

    def __init__(self, module: torch.nn.Module):
        self.forward_grad = self.forward_no_grad = self.backward = 0
        self._handles = [module.register_forward_pre_hook(self._on_forward),
                         module.register_full_backward_pre_hook(self._on_backward)]

    def _on_forward(self, module, args):
        if torch.is_grad_enabled():
            self.forward_grad += 1
        else:
            self.forward_no_grad += 1

    def _on_backward(self, module, grad_output):
        self.backward += 1

    def counts(self) -> dict[str, int]:
        return {"forward_grad": self.forward_grad, "forward_no_grad": self.forward_no_grad,
                "backward": self.backward}

    def close(self) -> None:
        for h in self._handles:
            h.remove()
