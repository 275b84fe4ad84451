"""The forward process x_t = (1 - sigma) x0 + sigma eps, against hand-computed values."""

import torch

from marble.maths.flow import forward_process


def test_forward_process_by_hand():
    x0 = torch.tensor([[2.0, -4.0]]).repeat(2, 1).reshape(2, 1, 1, 2)
    eps = torch.tensor([[10.0, 6.0]]).repeat(2, 1).reshape(2, 1, 1, 2)
    sigma = torch.tensor([0.25, 1.0])
    # sample 0: 0.75 * 2 + 0.25 * 10 = 4.0 and 0.75 * -4 + 0.25 * 6 = -1.5 (swapped sigma and
    # 1 - sigma would give 8.0 and 3.5); sample 1 at sigma = 1 is pure noise.
    expected = torch.tensor([[4.0, -1.5], [10.0, 6.0]]).reshape(2, 1, 1, 2)
    assert torch.equal(forward_process(x0, eps, sigma), expected)
    assert torch.equal(forward_process(x0, eps, 0.0), x0)  # sigma = 0: the clean latent
