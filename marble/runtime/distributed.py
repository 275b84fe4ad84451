"""torchrun-aware process group helpers (gloo on CPU, NCCL on CUDA).

Without the torchrun environment variables everything degrades to a single process:
the collectives below become identities, so the trainer, the balancers and the
evaluation code call them unconditionally.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


_INFO: DistInfo | None = None


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise RuntimeError(f"environment variable {name}={raw!r} is not an integer") from exc


def init_distributed(device: str | None = None, timeout_s: float = 1800.0) -> DistInfo:
    """Join the torchrun process group if the env says so; pick this rank's device.

    `device` forces "cpu" or "cuda"; by default CUDA when available, else CPU.
    Idempotent: a second call returns the first call's DistInfo.
    """
    global _INFO
    if _INFO is not None:
        return _INFO
    world_size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    use_cuda = torch.cuda.is_available() if device is None else device.startswith("cuda")
    if use_cuda and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but torch.cuda.is_available() is False")
    dev = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    if world_size > 1 and not dist.is_initialized():
        # NCCL for GPU tensors; gloo is the only CPU backend that supports every collective we use.
        backend = "nccl" if use_cuda else "gloo"
        dist.init_process_group(
            backend=backend, rank=rank, world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
    _INFO = DistInfo(rank=rank, world_size=world_size, local_rank=local_rank, device=dev)
    return _INFO


def world() -> DistInfo:
    """The current DistInfo (single CPU process if init_distributed was never called)."""
    if _INFO is not None:
        return _INFO
    if dist.is_available() and dist.is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size(), _env_int("LOCAL_RANK", 0),
                        torch.device("cpu"))
    return DistInfo(0, 1, 0, torch.device("cpu"))


def _active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _to_comm(tensor: torch.Tensor) -> torch.Tensor:
    """NCCL moves only CUDA tensors (and no bool): stage CPU/bool tensors accordingly."""
    if dist.get_backend() == "nccl":
        tensor = tensor.to(world().device if world().device.type == "cuda" else "cuda")
    return tensor.to(torch.uint8) if tensor.dtype == torch.bool else tensor


def is_main() -> bool:
    return world().rank == 0


def barrier() -> None:
    if _active():
        dist.barrier()


def all_reduce_mean_(tensor: torch.Tensor) -> torch.Tensor:
    """In-place mean over ranks; returns the tensor (identity on one process)."""
    if _active():
        staged = _to_comm(tensor)
        dist.all_reduce(staged, op=dist.ReduceOp.SUM)
        staged.div_(dist.get_world_size())
        if staged is not tensor:
            tensor.copy_(staged)
    return tensor


def all_reduce_sum_(tensor: torch.Tensor) -> torch.Tensor:
    if _active():
        staged = _to_comm(tensor)
        dist.all_reduce(staged, op=dist.ReduceOp.SUM)
        if staged is not tensor:
            tensor.copy_(staged)
    return tensor


def any_rank(flag: bool, device: torch.device | None = None) -> bool:
    """True on every rank when `flag` is True on at least one (e.g. a found-inf flag)."""
    if not _active():
        return bool(flag)
    box = torch.tensor([1.0 if flag else 0.0], device=device or world().device)
    return bool(all_reduce_sum_(box).item() > 0)


def all_gather_cat(tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Concatenate every rank's tensor along `dim`, in rank order (same shapes required)."""
    if not _active():
        return tensor
    staged = _to_comm(tensor).contiguous()
    parts = [torch.empty_like(staged) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, staged)
    return torch.cat(parts, dim=dim).to(device=tensor.device, dtype=tensor.dtype)


def all_gather_objects(obj: Any) -> list:
    """Every rank's picklable object, in rank order."""
    if not _active():
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank `src`'s object on every rank."""
    if not _active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def cleanup() -> None:
    global _INFO
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _INFO = None
