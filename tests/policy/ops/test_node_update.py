"""A layer's node update: the fused CPU function against the layer's own modules, forward and backward."""

import numpy as np
import pytest
import torch

from seeder.policy.model import EdgeModulatedAttention
from seeder.policy.ops import node_update as nu


def reference(layer: EdgeModulatedAttention, x: torch.Tensor, aggregated: torch.Tensor, masks) -> torch.Tensor:
    """The modules of the layer, with the fused path's dropout bytes applied as a mask."""

    def drop(u, mask):
        if len(mask) == 0:
            return u
        keep = torch.from_numpy(mask.astype(np.int32)).view(u.shape) >= layer.dropout.threshold
        return u * keep * layer.dropout.scale

    ffn = layer.ffn
    x1 = layer.norm_attention(x + drop(layer.out(aggregated), masks[0]))
    hidden = drop(ffn[1](ffn[0](x1)), masks[1])
    return layer.norm_ffn(x1 + drop(ffn[3](hidden), masks[2]))


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_fused_node_update_matches_the_modules_with_the_same_masks(dropout):
    torch.manual_seed(0)
    layer = EdgeModulatedAttention(32, 4, dropout).train()
    with torch.no_grad():  # LayerNorm parameters away from their (1, 0) start, so that their gradients matter
        for norm in (layer.norm_attention, layer.norm_ffn):
            norm.weight.add_(torch.randn(32) * 0.3)
            norm.bias.add_(torch.randn(32) * 0.3)
    x = torch.randn(300, 32, requires_grad=True)
    aggregated = torch.randn(300, 32, requires_grad=True)
    leaves = [x, aggregated, *layer.parameters()]
    assert nu.fused_supported(layer, x)

    torch.manual_seed(1)
    fused = nu.node_update(layer, x, aggregated)
    weights = torch.randn_like(fused)
    fused_grads = torch.autograd.grad((fused * weights).sum(), leaves, allow_unused=True)
    torch.manual_seed(1)  # the same seed draws the same bytes
    masks = nu.draw_masks(layer.dropout, 300, 32, 64)
    assert all(len(m) == (300 * w if dropout else 0) for m, w in zip(masks, (32, 64, 32)))
    if dropout:
        dropped = np.concatenate(masks) < layer.dropout.threshold
        assert abs(dropped.mean() - layer.dropout.threshold / 256) < 0.01
    expected = reference(layer, x, aggregated, masks)
    expected_grads = torch.autograd.grad((expected * weights).sum(), leaves, allow_unused=True)

    torch.testing.assert_close(fused, expected, atol=2e-6, rtol=1e-5)
    names = ["x", "aggregated", *(name for name, _ in layer.named_parameters())]
    for name, got, want in zip(names, fused_grads, expected_grads):
        if want is None:  # the attention's own products are not part of the node update
            assert got is None or not got.abs().any(), name
            continue
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4, msg=lambda m: f"{name}: {m}")


def test_node_update_takes_the_modules_where_the_kernels_do_not_serve():
    torch.manual_seed(0)
    layer = EdgeModulatedAttention(16, 2, 0.1).train()
    x, aggregated = torch.randn(20, 16, dtype=torch.float64), torch.randn(20, 16, dtype=torch.float64)
    layer.double()
    assert not nu.fused_supported(layer, x)  # float64: the modules
    layer.eval()  # no dropout: the module path is deterministic and equals the reference
    torch.testing.assert_close(nu.node_update(layer, x, aggregated), reference(layer, x, aggregated, [[]] * 3))
    layer.float()
    layer.ffn[2].p, layer.ffn[2].threshold = 0.5, 128
    assert not nu.fused_supported(layer, x.float())  # two dropout rates in one block: the modules


def test_fused_node_update_is_reproducible_from_the_torch_seed_and_drops_in_training_only():
    layer = EdgeModulatedAttention(32, 4, 0.1).train()
    x, aggregated = torch.randn(50, 32), torch.randn(50, 32)
    outputs = []
    for seed in (3, 3, 4):
        torch.manual_seed(seed)
        outputs.append(nu.node_update(layer, x, aggregated))
    assert torch.equal(outputs[0], outputs[1]) and not torch.equal(outputs[0], outputs[2])
    layer.eval()
    torch.testing.assert_close(
        nu.node_update(layer, x, aggregated), reference(layer, x, aggregated, [[]] * 3), atol=2e-6, rtol=1e-5
    )


def _shuffled_heap(rng: np.random.Generator) -> list[np.ndarray]:
    """Small arrays allocated (some kept, some freed) so that the next allocations land elsewhere."""
    junk = [np.empty(int(k)) for k in rng.integers(1, 40, 5)]
    return junk[: int(rng.integers(0, 3))]


def test_fused_node_update_gives_the_same_bits_wherever_its_arrays_lie():
    """A sum in a loop that also stores was vectorised behind a run-time test of the arrays' addresses and
    ran in another order when it failed: the first training step of a process (a resumed run's) differed
    in its last bits with the heap's layout."""
    torch.manual_seed(0)
    layer = EdgeModulatedAttention(16, 2, 0.1).train()
    x, aggregated = torch.randn(40, 16), torch.randn(40, 16)
    rng, kept, results = np.random.default_rng(0), [], set()
    for _ in range(150):
        kept += _shuffled_heap(rng)
        xi, ai = x.clone().requires_grad_(), aggregated.clone().requires_grad_()
        layer.zero_grad()
        torch.manual_seed(1)
        out = nu.node_update(layer, xi, ai)
        out.backward(torch.ones_like(out))
        grads = [xi.grad, ai.grad, *(p.grad for p in layer.parameters() if p.grad is not None)]
        results.add(b"".join(t.numpy().tobytes() for t in [out.detach(), *grads]))
    assert len(results) == 1
