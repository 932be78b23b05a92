"""Tiny datasets shared by the tests (preprocess, benchmark, retriever, training): written through the
store, and hand-built artifacts without Ray."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from seeder.data.store import write_dataset


def write_tiny_dataset(directory: Path, num_queries: int, seed: int, two_hop_answers: bool, id_stride: int) -> Path:
    """300 nodes with plain-text names, 1,500 random edges over 4 relations, and ``num_queries`` queries
    ("what is related to <name>") spread over train / val / test with a ``hop`` attribute (1, 2, 1, ...).

    Answers are graph neighbours of the named entity, so a good subgraph can contain them: the first
    out-neighbour, or with ``two_hop_answers`` up to three nodes at the query's hop count. Query ids are
    ``i * id_stride + 2``: not contiguous, since ids are kept and never assumed to be row numbers.
    """
    rng = np.random.default_rng(seed)
    n, e, r = 300, 1500, 4
    names = [f"entity {i} {['red', 'blue', 'green', 'tall', 'old'][i % 5]}" for i in range(n)]
    nodes = pa.table({"id": np.arange(n), "type": ["thing"] * n, "name": names, "text": names})
    relations = pa.table(
        {
            "id": np.arange(r, dtype=np.int32),
            "name": [f"rel{i}" for i in range(r)],
            "text": [f"relation {i}" for i in range(r)],
            "inverse_text": [f"inverse of relation {i}" for i in range(r)],
        }
    )
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    edges = pa.table({"src": src, "dst": dst, "relation": rng.integers(0, r, e).astype(np.int32)})
    topic = rng.integers(0, n, num_queries)
    hop = (np.arange(num_queries) % 2 + 1).astype(np.int64)
    successors = [dst[src == i] for i in range(n)]  # test data only: 300 small lists
    if two_hop_answers:
        answers = []
        for t, h in zip(topic.tolist(), hop.tolist()):
            reach = set(successors[t].tolist())
            if h == 2:
                reach = set(np.concatenate([successors[v] for v in reach]).tolist()) if reach else set()
            answers.append(sorted(reach)[:3] or [t])
    else:
        answers = [[int(successors[t][0])] if len(successors[t]) else [int(t)] for t in topic]
    queries = pa.table(
        {
            "id": np.arange(num_queries) * id_stride + 2,
            "text": [f"what is related to {names[t]}" for t in topic],
            "answers": answers,
            "split": np.array(["train", "val", "test"])[np.arange(num_queries) % 3],
            "hop": hop,
        }
    )
    return write_dataset(directory, nodes, relations, edges, queries)


def hand_built_artifacts(
    root: Path, strategy: str, relations: int = 3, reduce_dim: int = 256, seed: int = 3, trained_on=None, step_budget=None
):
    """A 60-node graph whose questions name an entity, preprocessed by hand with the hash encoder (the
    library's seeds stage, no Ray) under ``seed.strategy=strategy``, and an untrained model on it (that
    records ``trained_on``'s artifacts, or these). ``reduce_dim`` only goes into the config: the features
    are the encoder's either way. ``step_budget`` is recorded as if preprocessing had derived it."""
    import pyarrow as pa

    from seeder.data.store import write_dataset
    from seeder.policy.checkpoint import artifacts_record
    from seeder.preprocessing.artifacts import open_artifacts
    from seeder.training.loop import build_state, export_best

    rng = np.random.default_rng(seed)
    n, r, q, dim = 60, relations, 12, 32
    relation_names = [f"relation {chr(97 + i)}" for i in range(r)]
    names = [
        f"entity {w}"
        for w in (
            "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron "
            "pi rho sigma tau upsilon phi chi psi omega"
        ).split()
    ] + [f"place {i}" for i in range(n - 24)]
    answers = [[int(a)] for a in rng.integers(0, n, q)]
    queries = pa.table(
        {
            "id": np.arange(q) + 100,
            "text": [f"what is linked to {names[i]}" for i in range(q)],
            "answers": answers,
            "split": ["train"] * 4 + ["val"] * 8,
            "topic_id": np.arange(q),
        }
    )
    dataset = write_dataset(
        root / "dataset",
        pa.table({"id": np.arange(n), "type": [name.split()[0] for name in names], "name": names, "text": names}),
        pa.table(
            {
                "id": np.arange(r, dtype=np.int32),
                "name": relation_names,
                "text": relation_names,
                "inverse_text": [f"{t} of" for t in relation_names],
            }
        ),
        pa.table(
            {"src": rng.integers(0, n, 240), "dst": rng.integers(0, n, 240), "relation": rng.integers(0, r, 240).astype(np.int32)}
        ),
        queries,
    )
    config = hand_config(strategy, reduce_dim, dim)
    out = preprocess_by_hand(dataset, root / "artifacts", config, step_budget)
    record = artifacts_record(open_artifacts(trained_on or out))
    model = export_best(build_state(config, dim, 1, record), root / "model")
    return out, model, queries.column("text").to_pylist()


def hand_config(strategy: str = "dense", reduce_dim: int = 256, dim: int = 32):
    """The settings of ``hand_built_artifacts``: the hash encoder, small budgets, a one-layer policy."""
    from seeder.config import load_config

    return load_config(
        None,
        [
            "embed.encoder=hash",
            f"embed.hash_dim={dim}",
            f"seed.strategy={strategy}",
            "seed.k0=2",
            "expand.budget=20",
            "expand.keep_per_hop=[8,10]",
            "model.hidden_dim=16",
            "model.num_layers=1",
            "train.expansion_sizes=[3,3]",
            "train.frontier_caps=[8,8]",
            f"reduce.dim={reduce_dim}",
        ],
    )


def write_artifacts_manifest(out: Path, dataset: Path, kg, config, **extra) -> None:
    """The top-level manifest of artifacts written by hand: the dataset, its fingerprint, the config and
    ``extra`` entries (a ``step_budget``, stage ``fingerprints``)."""
    from seeder.config import to_dict
    from seeder.system.io import write_manifest

    manifest = {"kind": "seeder-artifacts", "dataset": str(dataset), "dataset_fingerprint": kg.fingerprint}
    write_manifest(out, {**manifest, "config": to_dict(config), **extra})


def preprocess_by_hand(dataset: Path, out: Path, config, step_budget=None) -> Path:
    """Artifacts of ``dataset`` at ``out`` without Ray: hash features of every text (``config.embed``), the
    library's seeds stage and K-HOP-WITH-FILTERING, and a manifest as preprocessing writes it."""
    import pyarrow.parquet as pq

    from seeder.data.store import open_dataset
    from seeder.features.embed import HashEncoder
    from seeder.preprocessing.artifacts import read_seed_table
    from seeder.preprocessing.stages import answer_csr, run_seeds
    from seeder.retrieve.khop import expand_queries
    from seeder.system.io import write_manifest

    kg = open_dataset(dataset)
    queries = kg.queries
    relations = kg.relations
    encoder = HashEncoder(dim=config.embed.hash_dim)
    nf = encoder.encode(kg.nodes.column("text").to_pylist())
    qf = encoder.encode(queries.column("text").to_pylist())
    rf = encoder.encode(relations.column("text").to_pylist() + relations.column("inverse_text").to_pylist())
    query_ids = np.asarray(queries.column("id").to_numpy())
    (out / "features").mkdir(parents=True)
    (out / "seeds").mkdir()
    for name, array in (("node", nf), ("relation", rf), ("query", qf), ("query_ids", query_ids)):
        np.save(out / "features" / f"{name}.npy", array)
    write_manifest(out / "features", {"stage": "features"})
    run_seeds(out / "features", out / "seeds", kg, config)
    _, seeds, scores = read_seed_table(out / "seeds" / "seeds.parquet")
    splits = np.array(queries.column("split").to_pylist(), dtype=object)
    answer_ptr, answers = answer_csr(queries)
    subgraphs = expand_queries(kg, nf, rf, qf, seeds, scores, config.expand, query_ids, splits, answer_ptr, answers)
    (out / "subgraphs").mkdir()
    pq.write_table(subgraphs.to_arrow(), out / "subgraphs" / "part-00000.parquet")
    write_manifest(out / "subgraphs", {"stage": "subgraphs"})
    write_artifacts_manifest(out, dataset, kg, config, **({"step_budget": step_budget} if step_budget else {}))
    return out
