"""ByteDropout: the compiled CPU path and the torch path drop p of the values and keep the expectation."""

import pytest
import torch

from seeder.policy.ops.dropout import ByteDropout


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["compiled-cpu", "torch"])
def test_byte_dropout_drops_p_of_the_values_and_keeps_the_expectation(dtype):
    torch.manual_seed(0)
    drop = ByteDropout(0.1).train()
    x = torch.ones(1000, 301, dtype=dtype)  # not a multiple of 8 values: the last word's bytes
    y = drop(x)
    assert y.dtype == dtype
    dropped = (y == 0).to(torch.float64).mean().item()
    assert abs(dropped - 26 / 256) < 0.003  # p rounded to 26/256
    assert abs(y.mean().item() - 1.0) < 0.005  # kept values scaled by 256/230
    assert y.unique().tolist() == [0.0, pytest.approx(256 / 230)]
    assert (y[:, -5:] == 0).any() and (y[:, -5:] != 0).any()  # the tail is masked too
    assert not torch.equal(drop(x), y)  # a fresh mask per call
    x.requires_grad_(True)
    out = drop(x)
    out.sum().backward()
    assert torch.equal(x.grad, out.detach())  # the gradient is the same mask and scale (x is all ones)
    assert torch.equal(drop.eval()(x), x) and torch.equal(ByteDropout(0.0).train()(x), x)
    with pytest.raises(Exception, match="model.dropout"):
        ByteDropout(1.0)


def test_byte_dropout_follows_torchs_seed_and_masks_the_gradient_it_masked_forward():
    drop = ByteDropout(0.3).train()
    x = torch.randn(257, 3)
    torch.manual_seed(5)
    first = drop(x)
    torch.manual_seed(5)
    assert torch.equal(drop(x), first)  # reproducible from torch's generator
    leaf = x.clone().requires_grad_(True)
    torch.manual_seed(5)
    out = drop(leaf)
    weights = torch.randn(257, 3)
    (out * weights).sum().backward()
    torch.testing.assert_close(leaf.grad, torch.where(first == 0, 0.0, weights * drop.scale))
    mask = drop.mask((64, 2), x)
    assert mask.shape == (64, 2) and mask.unique().tolist() == [0.0, pytest.approx(drop.scale)]
    assert drop.eval().mask((64, 2), x) is None
