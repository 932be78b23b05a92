"""The layer's relation-modulated attention: the fused CPU kernels against the torch ops, forward and backward."""

import pytest
import torch

from seeder.policy.ops.dropout import ByteDropout
from seeder.policy.ops.edge_attention import (
    edge_attention,
    edge_attention_torch,
    edge_index_for,
    group_edges,
    segment_softmax,
    segment_sum,
)


def test_segment_softmax_and_sum_match_a_per_target_loop():
    torch.manual_seed(0)
    index = torch.tensor([3, 0, 3, 3, 1, 0, 3])  # target 2 has no incoming edge
    logits = torch.randn(7, 2, dtype=torch.float64) * 50  # large values: the per-segment maximum matters
    alpha = segment_softmax(logits, index, 4)
    for target in range(4):
        rows = index == target
        if rows.any():
            torch.testing.assert_close(alpha[rows], torch.softmax(logits[rows], dim=0))
    messages = torch.randn(7, 2, 3, dtype=torch.float64)
    summed = segment_sum(messages, index, 4)
    for target in range(4):
        torch.testing.assert_close(summed[target], messages[index == target].sum(0))
    assert torch.isfinite(alpha).all() and (summed[2] == 0).all()


def test_group_edges_lists_each_targets_edges_and_each_sources_in_order():
    src = torch.tensor([4, 0, 2, 2, 1, 0, 4])
    dst = torch.tensor([1, 3, 1, 0, 3, 1, 2])
    types = torch.arange(7) * 10
    groups = group_edges(src, dst, types, 5)
    assert groups.ptr.tolist() == [0, 1, 4, 5, 7, 7]  # node 4 has no incoming edge
    assert groups.order.tolist() == [3, 0, 2, 5, 6, 1, 4]  # stable within a target
    assert groups.src.tolist() == src[groups.order].tolist() and groups.dst.tolist() == dst[groups.order].tolist()
    assert groups.edge_type.tolist() == (groups.order * 10).tolist()
    for node in range(5):  # by_source: the grouped positions of each source's edges
        grouped = groups.by_source[groups.source_ptr[node] : groups.source_ptr[node + 1]]
        assert sorted(groups.order[grouped].tolist()) == (src == node).nonzero().squeeze(1).tolist()


def random_layer(num_nodes: int, num_edges: int, num_types: int, seed: int, heads: int = 2, head_dim: int = 16):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(num_nodes, 3, heads, head_dim, generator=g) * 2  # large logits: the softmax's maximum matters
    edge_key = torch.randn(num_types, heads, head_dim, generator=g)
    edge_value = torch.randn(num_types, heads, head_dim, generator=g)
    src = torch.randint(0, num_nodes, (num_edges,), generator=g)
    dst = torch.randint(0, num_nodes - 3, (num_edges,), generator=g)  # the last 3 nodes have no incoming edge
    types = torch.randint(0, num_types, (num_edges,), generator=g)
    return qkv, edge_key, edge_value, src, dst, types


def gradients(fn, qkv, edge_key, edge_value, weights):
    leaves = [t.detach().clone().requires_grad_(True) for t in (qkv, edge_key, edge_value)]
    out = fn(*leaves)
    (out * weights).sum().backward()
    return [out.detach()] + [t.grad for t in leaves]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dropout", [False, True], ids=["no-dropout", "dropout"])
def test_fused_kernels_match_the_torch_ops_forward_and_backward(threads, dropout):
    qkv, edge_key, edge_value, src, dst, types = random_layer(300, 2000, 12, seed=threads)
    keep = ByteDropout(0.25).train().mask((len(src), 2), qkv) if dropout else None
    weights = torch.randn(300, 2, 16, generator=torch.Generator().manual_seed(7))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)  # the fused path runs its serial kernels on one thread
    try:
        edges = edge_index_for(src, dst, types, 300, qkv)
        assert edges.groups is not None
        fused = gradients(lambda *t: edge_attention(*t, edges, keep), qkv, edge_key, edge_value, weights)
    finally:
        torch.set_num_threads(before)
    reference = gradients(lambda *t: edge_attention_torch(*t, src, dst, types, keep), qkv, edge_key, edge_value, weights)
    for name, got, want in zip(["output", "qkv", "edge_key", "edge_value"], fused, reference):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4, msg=name)
    assert (fused[0][-3:] == 0).all() and (fused[1][-3:, 0] == 0).all()  # no incoming edge: no output, no query grad
    if dropout:  # the mask was used: a dropped edge neither carries a message nor gets a gradient
        assert (keep == 0).any()


def test_other_dtypes_and_devices_run_the_torch_ops():
    qkv, edge_key, edge_value, src, dst, types = random_layer(40, 200, 5, seed=3)
    qkv64, key64, value64 = qkv.double(), edge_key.double(), edge_value.double()
    edges = edge_index_for(src, dst, types, 40, qkv64)
    assert edges.groups is None  # float64: not grouped, so the torch ops run
    got = edge_attention(qkv64, key64, value64, edges, None)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, edge_attention_torch(qkv64, key64, value64, src, dst, types, None))
    fused = edge_attention(qkv, edge_key, edge_value, edge_index_for(src, dst, types, 40, qkv), None)
    torch.testing.assert_close(fused.double(), got, atol=1e-5, rtol=1e-5)


def test_importing_the_model_loads_no_numba():
    """A GPU machine runs the torch ops: the compiled kernels (and numba) load on the CPU path only."""
    import subprocess
    import sys

    code = "import sys, seeder.policy.model, seeder.policy.rollout, seeder.training.loop; print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
