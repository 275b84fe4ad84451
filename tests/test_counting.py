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
