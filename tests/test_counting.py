"""The live-tensor memory and pass counters behind `marble bench flops`, by hand."""

import torch

from marble.tools.counting import LiveTensorMemory, PassCounter


def test_live_memory_counts_storages_once_and_frees():
    with LiveTensorMemory() as mem:
        a = torch.empty(1000, device="meta")  # 4000 bytes
        view = a.view(10, 100)  # same storage: not counted again
        b = a * 2  # 4000 more
        assert mem.current == 8000 and view.shape == (10, 100)
        del b
        assert mem.current == 4000
        c = torch.empty(10, dtype=torch.float16, device="meta")  # 20 bytes
    assert mem.peak == 8000 and mem.current == 4020 and c.numel() == 10
    mem.reset_peak()
    assert mem.peak == 4020


def test_pass_counter_splits_grad_modes_and_counts_backward():
    lin = torch.nn.Linear(3, 2)
    passes = PassCounter(lin)
    x = torch.ones(4, 3)
    with torch.no_grad():
        lin(x)
    loss = lin(x).sum()
    loss.backward(retain_graph=True)
    loss.backward()
    passes.close()
    lin(x)  # after close: not counted
    assert passes.counts() == {"forward_grad": 1, "forward_no_grad": 1, "backward": 2}


def test_flop_counter_counts_in_place_matmuls():
    """torch's FlopCounterMode counts `addmm` but leaves `addmm_` (the balancers' Gram) at 0."""
    from torch.utils.flop_counter import FlopCounterMode

    from marble.tools.counting import flop_counter

    a, b = torch.empty(3, 5, device="meta"), torch.empty(5, 4, device="meta")
    for counter, want in ((FlopCounterMode(display=False), 0), (flop_counter(), 2 * 3 * 5 * 4)):
        with counter:
            torch.zeros(3, 4, device="meta").addmm_(a, b)
        assert counter.get_total_flops() == want
    x, y = torch.empty(2, 3, 5, device="meta"), torch.empty(2, 5, 4, device="meta")
    with flop_counter() as c:
        torch.zeros(2, 3, 4, device="meta").baddbmm_(x, y)
    assert c.get_total_flops() == 2 * 2 * 3 * 5 * 4
