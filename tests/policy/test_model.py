"""The policy network: gradients, permutation equivariance, disjoint-union batching."""

import pytest
import torch

from seeder.config import ModelConfig
from seeder.policy.model import SeedERPolicy, count_parameters, linear


def graph(num_nodes: int, num_edges: int, dim: int, num_relations: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return {
        "node_text": torch.randn(num_nodes, dim, generator=g),
        "query_features": torch.randn(1, dim, generator=g),
        "node_graph": torch.zeros(num_nodes, dtype=torch.long),
        "hop": torch.randint(0, 3, (num_nodes,), generator=g),
        "filter_score": torch.rand(num_nodes, generator=g),
        "path_end": -5 * torch.rand(num_nodes, generator=g),
        "selected": torch.rand(num_nodes, generator=g) < 0.5,
        "edge_index": torch.randint(0, num_nodes, (2, num_edges), generator=g),
        "edge_type": torch.randint(0, 2 * num_relations, (num_edges,), generator=g),
    }


@pytest.fixture(params=[("concat", False), ("add", False), ("concat", True)], ids=["concat", "add", "step-relations"])
def model(request):
    torch.manual_seed(0)
    injection, step_relations = request.param
    config = ModelConfig(
        hidden_dim=16, num_layers=2, num_heads=2, dropout=0.0, query_injection=injection, step_relations=step_relations
    )
    return SeedERPolicy(8, config).eval()


RELATIONS = torch.randn(6, 8, generator=torch.Generator().manual_seed(9))


def test_gradients_reach_every_parameter(model):
    model.train()
    g = graph(12, 40, 8, 3, seed=1)
    g["edge_type"] = torch.arange(40) % 6  # every relation and both directions occur
    g["selected"] = torch.arange(12) % 2 == 0  # both state embeddings occur
    _, logits, scores = model(**g, relation_features=RELATIONS)
    (logits.square().sum() + scores.square().sum()).backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert missing == []
    assert count_parameters(model) < 1_000_000


def test_node_outputs_are_permutation_equivariant(model):
    g = graph(15, 50, 8, 3, seed=2)
    h, logits, scores = model(**g, relation_features=RELATIONS)
    perm = torch.randperm(15, generator=torch.Generator().manual_seed(3))
    inverse = torch.argsort(perm)
    permuted = {k: (v[perm] if k not in ("edge_index", "edge_type", "query_features") else v) for k, v in g.items()}
    permuted["edge_index"] = inverse[g["edge_index"]]
    h2, logits2, scores2 = model(**permuted, relation_features=RELATIONS)
    torch.testing.assert_close(h2, h[perm], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits2, logits[perm], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(scores2, scores[perm], rtol=1e-5, atol=1e-5)


def test_disjoint_union_equals_separate_runs(model):
    a, b = graph(10, 30, 8, 3, seed=4), graph(7, 20, 8, 3, seed=5)
    union = {k: torch.cat([a[k], b[k]]) for k in a if k not in ("edge_index", "edge_type", "node_graph")}
    union["node_graph"] = torch.cat([a["node_graph"], b["node_graph"] + 1])  # two graphs, two queries
    union["edge_index"] = torch.cat([a["edge_index"], b["edge_index"] + 10], dim=1)
    union["edge_type"] = torch.cat([a["edge_type"], b["edge_type"]])
    _, logits_u, scores_u = model(**union, relation_features=RELATIONS)
    _, logits_a, scores_a = model(**a, relation_features=RELATIONS)
    _, logits_b, scores_b = model(**b, relation_features=RELATIONS)
    torch.testing.assert_close(logits_u, torch.cat([logits_a, logits_b]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(scores_u, torch.cat([scores_a, scores_b]), rtol=1e-5, atol=1e-5)


def test_edges_change_the_output(model):
    """The attention really uses the edges and their relation types (no silent MLP fallback)."""
    g = graph(10, 30, 8, 3, seed=6)
    _, logits, _ = model(**g, relation_features=RELATIONS)
    other = dict(g, edge_type=(g["edge_type"] + 1) % 6)
    _, logits_other, _ = model(**other, relation_features=RELATIONS)
    assert not torch.allclose(logits, logits_other)


def test_the_path_end_feature_reaches_the_scores(model):
    """The prior's ending mass is an input of the policy: changing it changes the final scores."""
    g = graph(10, 30, 8, 3, seed=7)
    _, _, scores = model(**g, relation_features=RELATIONS)
    _, _, moved = model(**dict(g, path_end=g["path_end"] - 3.0), relation_features=RELATIONS)
    assert not torch.allclose(scores, moved)


def test_step_relations_condition_edges_on_the_source_state():
    """With model.step_relations an edge's embedding depends on the rollout state of its source: the
    same relation, query and target give a different message from a seed than from a node added later."""
    torch.manual_seed(0)
    model = SeedERPolicy(8, ModelConfig(hidden_dim=16, num_layers=1, dropout=0.0, step_relations=True)).eval()
    queries = torch.randn(3, 8)
    emb = model.encode_relations(RELATIONS, queries)
    assert emb.shape == (3, model.num_source_states, 6, 16)
    assert not torch.allclose(emb[:, 1], emb[:, 2])  # seed vs. added at step 0
    plain = SeedERPolicy(8, ModelConfig(hidden_dim=16, num_layers=1, dropout=0.0))
    assert plain.encode_relations(RELATIONS, queries).shape == (3, 1, 6, 16)
    # Node 0 -> node 1 with relation 2. Only the relation row chosen by the source's state differs between
    # the two calls when the state embeddings of states 1 and 2 are made equal.
    with torch.no_grad():
        model.state_embedding.weight[2] = model.state_embedding.weight[1]
    state = torch.randn(2, 16)
    edge_index, edge_type = torch.tensor([[0], [1]]), torch.tensor([2])
    from_seed = model.propagate(state, torch.tensor([1, 0]), edge_index, edge_type, model.relation_tables(emb[:1]))
    from_step = model.propagate(state, torch.tensor([2, 0]), edge_index, edge_type, model.relation_tables(emb[:1]))
    torch.testing.assert_close(from_seed[0], from_step[0])
    assert not torch.allclose(from_seed[1], from_step[1])


def test_bad_config_is_a_clear_error():
    from seeder.config import ConfigError

    with pytest.raises(ConfigError, match="query_injection"):
        SeedERPolicy(8, ModelConfig(query_injection="mul"))
    with pytest.raises(ConfigError, match="divisible"):
        SeedERPolicy(8, ModelConfig(hidden_dim=15, num_heads=2))


def test_the_path_end_residual_adds_its_learnt_weight_times_path_end():
    """model.path_end_residual: the final score is the scoring head's score plus w * path_end, w learnt
    from 1; without it the score is the head's alone (the paper's)."""
    torch.manual_seed(0)
    config = ModelConfig(hidden_dim=16, num_layers=2, num_heads=2, dropout=0.0)
    with_residual = SeedERPolicy(8, config).eval()
    plain = SeedERPolicy(8, ModelConfig(hidden_dim=16, num_layers=2, num_heads=2, dropout=0.0, path_end_residual=False)).eval()
    plain.load_state_dict({k: v for k, v in with_residual.state_dict().items() if k != "path_end_weight"})
    assert float(with_residual.path_end_weight) == 1.0 and plain.path_end_weight is None
    h, ctx, path_end = torch.randn(5, 16), torch.randn(5, 16), -4 * torch.rand(5)
    head = plain.scores(h, ctx, path_end)
    torch.testing.assert_close(with_residual.scores(h, ctx, path_end), head + path_end)
    with torch.no_grad():
        with_residual.path_end_weight.fill_(2.5)
    torch.testing.assert_close(with_residual.scores(h, ctx, path_end), head + 2.5 * path_end)


@pytest.mark.parametrize("injection", ["concat", "add"])
def test_encode_nodes_equals_the_input_projection_of_each_nodes_own_inputs(injection):
    # The query's block of the first layer is computed once per query and gathered; it must equal the
    # projection of [text, W_q z_q, cos, hop one-hot, filter score, path end] built node by node.
    torch.manual_seed(0)
    model = SeedERPolicy(12, ModelConfig(hidden_dim=16, num_heads=2, query_injection=injection)).eval()
    n, b = 40, 3
    text, queries = torch.randn(n, 12), torch.randn(b, 12)
    owner, hop = torch.randint(0, b, (n,)), torch.randint(0, 4, (n,))
    score, path_end = torch.rand(n), torch.rand(n)
    node_query = queries[owner]
    injected = model.query_map(node_query)
    hops = torch.nn.functional.one_hot(hop, 5).float()
    scalars = torch.stack([score, path_end], -1)
    if injection == "concat":
        cosine = torch.nn.functional.cosine_similarity(text, node_query, dim=-1).unsqueeze(-1)
        inputs = torch.cat([text, injected, cosine, hops, scalars], -1)
    else:
        inputs = torch.cat([text + injected, hops, scalars], -1)
    want = model.input_proj(inputs)
    got = model.encode_nodes(text, queries, owner, hop, score, path_end)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_linear_adds_the_bias_outside_the_product_when_compiled_and_agrees_with_nn_linear():
    torch.manual_seed(0)
    x, weight, bias = torch.randn(37, 16), torch.randn(24, 16), torch.randn(24)
    expected = torch.nn.functional.linear(x, weight, bias)
    assert torch.equal(linear(x, weight, bias), expected)  # eagerly, the plain nn.Linear product
    compiled = torch.compile(linear, dynamic=True)
    torch.testing.assert_close(compiled(x, weight, bias), expected)
    torch.testing.assert_close(compiled(x, weight, None), torch.nn.functional.linear(x, weight))
    batched = torch.randn(3, 5, 16)  # other ranks keep nn.Linear's product
    torch.testing.assert_close(compiled(batched, weight, bias), torch.nn.functional.linear(batched, weight, bias))
