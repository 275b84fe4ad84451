"""Per-sample LoRA gradients, contracted on the fly (`balancer.fresh: exact`, issue 46).

The exact fresh balance needs, per micro-step, the K reward gradients
g_k = sum_i a_ki grad l+_i + b_ki grad l-_i (marble.maths.fresh_balance.affine_coefficients).
`PerSampleGrads` gets them from two ordinary backward passes (cotangents sum_i l+_i and
sum_i l-_i): at every trainable nn.Linear it forms the per-sample weight gradient
G_i = sum_t dy_it x_it^T from the layer's input (kept by a tensor hook registered at the
forward) and its output gradient, and immediately contracts it with the [K, B] coefficients
of that pass into a [K, P] buffer. No [B, P] per-sample gradient outlives its layer.

Why hooks (the Opacus technique) and not the alternatives:
- `torch.func` (vmap over grad) reruns the forward per sample inside vmap: a second forward,
  and diffusers' attention processors and peft's adapter switching are not functional.
- torchjd's autogram `Engine` computes the 2B x 2B Gramian of the per-sample losses; it is
  the `zoo` extra (not installed by default), and a Gramian is local to a rank: the Gram of
  rank-averaged gradients needs their cross-rank inner products, i.e. the vectors. The K
  reward gradients here are all-reduced exactly as full MGDA's (exact across ranks).
- Per-sample hooks cost what the summed weight gradient costs (B T d_out d_in per layer)
  plus K B d_out d_in for the contraction, and no extra forward.

Requirements, checked: every trainable parameter is the weight or bias of an nn.Linear
(LoRA's A and B are), dim 0 of a layer's input is the micro-batch's sample index, and samples
do not interact in the forward (no batch norm; attention is per sample in SD3).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn

__all__ = ["PerSampleGrads"]


class PerSampleGrads:
    """Records the inputs of `root`'s trainable Linear layers during a forward (`recording`)
    and, during a backward under `contracting(coef)`, adds sum_i coef[k, i] grad_theta f_i
    of the backpropagated per-sample functions f_i into a [K, P] buffer (P = the flat
    concatenation of `params`, in their order)."""

    def __init__(self, root: nn.Module, params: list):
        self.params = list(params)
        owner = {}
        for module in root.modules():
            if isinstance(module, nn.Linear):
                for name in ("weight", "bias"):
                    p = getattr(module, name)
                    if p is not None:
                        owner[id(p)] = (module, name)
        missing = [i for i, p in enumerate(self.params) if id(p) not in owner]
        if missing:
            raise ValueError(f"balancer.fresh = exact: parameters {missing[:5]} (of "
                             f"{len(self.params)}) are not the weight or bias of an nn.Linear "
                             "in the model; per-sample gradients are formed for Linear layers")
        self.offsets, offset = {}, 0
        for p in self.params:
            self.offsets[id(p)] = (offset, p)
            offset += p.numel()
        self.numel = offset
        self.modules = {id(m): m for m, _ in (owner[id(p)] for p in self.params)}.values()
        self.batch: int | None = None
        self._coef: torch.Tensor | None = None
        self._acc: torch.Tensor | None = None

    @contextlib.contextmanager
    def recording(self, batch: int) -> Iterator[None]:
        """A forward of `batch` samples under this context keeps each layer's input for the
        per-sample gradients (the autograd graph keeps it anyway, for the weight gradient)."""
        self.batch = int(batch)
        handles = [m.register_forward_hook(self._forward_hook) for m in self.modules]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def _forward_hook(self, module, inputs, output) -> None:
        if not (torch.is_tensor(output) and output.requires_grad):
            return  # a no-grad forward (v_old, v_ref, diagnostics): nothing to collect
        x = inputs[0]
        if x.shape[0] != self.batch:
            raise ValueError(f"balancer.fresh = exact: a Linear layer's input has {x.shape[0]} "
                             f"rows, the micro-batch {self.batch} samples (dim 0 must be the sample)")
        output.register_hook(lambda gy, m=module, x=x: self._add(m, x, gy))

    def _add(self, module: nn.Linear, x: torch.Tensor, gy: torch.Tensor) -> None:
        if self._coef is None:
            return None  # an ordinary backward: this hook changes nothing
        b = self.batch
        xs = x.detach().reshape(b, -1, x.shape[-1]).float()
        gs = gy.detach().reshape(b, -1, gy.shape[-1]).float()
        coef = self._coef
        for name in ("weight", "bias"):
            p = getattr(module, name)
            if p is None or id(p) not in self.offsets:
                continue
            # per sample: G_i = sum_t dy_it x_it^T [B, out, in] (bias: sum_t dy_it), then
            # sum_i coef[k, i] G_i; the sum over tokens first costs what the summed
            # weight gradient costs, the contraction K B out in more.
            per = torch.bmm(gs.transpose(1, 2), xs) if name == "weight" else gs.sum(1)
            start, _ = self.offsets[id(p)]
            self._acc[:, start:start + p.numel()] += coef @ per.reshape(b, -1)
        return None

    @contextlib.contextmanager
    def contracting(self, coef: torch.Tensor) -> Iterator[torch.Tensor]:
        """Within it, backward passes add coef [K, B] contracted per-sample gradients into the
        yielded [K, P] float32 buffer (zeros at entry)."""
        if self.batch is None or coef.shape[1] != self.batch:
            raise ValueError(f"coefficients {tuple(coef.shape)} for a micro-batch of {self.batch}")
        device = self.params[0].device
        self._acc = torch.zeros(coef.shape[0], self.numel, device=device)
        self._coef = coef.to(device=device, dtype=torch.float32)
        try:
            yield self._acc
        finally:
            self._coef, self._acc = None, None
