"""marble.runtime.distributed: single-process identities and a real 2-process gloo group."""

from __future__ import annotations

import os
import socket

import torch
import torch.multiprocessing as mp

from marble.runtime import distributed as dist


def test_single_process_is_identity(monkeypatch):
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    dist.cleanup()
    info = dist.init_distributed("cpu")
    try:
        assert (info.rank, info.world_size, info.device.type) == (0, 1, "cpu")
        assert dist.is_main() and dist.world() is info
        t = torch.tensor([1.0, 2.0])
        assert dist.all_reduce_mean_(t) is t and t.tolist() == [1.0, 2.0]
        assert dist.all_gather_cat(t) is t
        assert dist.all_gather_objects({"a": 1}) == [{"a": 1}]
        dist.barrier()
    finally:
        dist.cleanup()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
                      RANK=str(rank), LOCAL_RANK=str(rank))
    info = dist.init_distributed("cpu")
    mean = dist.all_reduce_mean_(torch.tensor([float(rank), 10.0 * rank]))
    gathered = dist.all_gather_cat(torch.full((2,), float(rank)))
    flags = dist.all_gather_cat(torch.tensor([rank == 0, True]))
    objects = dist.all_gather_objects({"rank": info.rank})
    bcast = dist.broadcast_object(f"from {info.rank}")
    torch.save({"mean": mean, "gathered": gathered, "objects": objects, "bcast": bcast,
                "flags": flags,
                "world": info.world_size, "main": dist.is_main()},
               os.path.join(out_dir, f"r{rank}.pt"))
    dist.barrier()
    dist.cleanup()


def test_two_process_gloo_collectives(tmp_path):
    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    r0 = torch.load(tmp_path / "r0.pt", weights_only=True)
    r1 = torch.load(tmp_path / "r1.pt", weights_only=True)
    for r in (r0, r1):
        assert r["world"] == 2
        assert r["mean"].tolist() == [0.5, 5.0]
        assert r["gathered"].tolist() == [0.0, 0.0, 1.0, 1.0]
        assert r["objects"] == [{"rank": 0}, {"rank": 1}]
        assert r["bcast"] == "from 0"
        assert r["flags"].dtype == torch.bool and r["flags"].tolist() == [True, True, False, True]
    assert r0["main"] and not r1["main"]
