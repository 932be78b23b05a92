"""Preprocessing an update without Ray: the library stages of ``seeder.preprocessing.incremental`` on a
tiny graph changed by adding, removing and editing triples, node texts and questions, against a full
run on the new version. Without a PCA the two are equal bit for bit (features, seeds, golden paths,
subgraphs), and the update recomputes fewer rows than there are."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from seeder.config import load_config, to_dict
from seeder.data.store import open_dataset
from seeder.data.subgraphs import SubgraphSet
from seeder.data.update import update_dataset
from seeder.features import bfloat16
from seeder.features.embed import load_encoder
from seeder.preprocessing import incremental as inc
from seeder.preprocessing import stages as pp
from seeder.preprocessing.artifacts import open_artifacts, read_seed_table
from seeder.system.io import DataError, write_manifest
from tests.datasets import write_artifacts_manifest, write_tiny_dataset

SHARD_ROWS = 64


def config_for(strategy: str, reduce_dim: int = 0, learned: bool = False, extra: tuple[str, ...] = ()):
    return load_config(
        None,
        [
            "embed.encoder=hash",
            "embed.hash_dim=32",
            f"reduce.dim={reduce_dim}",
            f"seed.strategy={strategy}",
            "seed.k0=2",
            "seed.entity_min_chars=3",
            "expand.budget=20",
            "expand.hops=2",
            "expand.keep_per_hop=[8,10]",
            f"expand.relation_score={'learned' if learned else 'cosine'}",
            "prior.epochs=2",
            *extra,
        ],
    )


def write_change(root: Path, parent: Path) -> Path:
    """A change set of the tiny dataset: edges added and removed, node texts edited, a node added and
    one removed, questions added and removed; written as a new version."""
    kg = open_dataset(parent)
    rng = np.random.default_rng(7)
    names = kg.node_names.to_pylist()
    edges = kg.table("edges")
    src, dst, rel = (edges.column(c).to_numpy() for c in ("src", "dst", "relation"))
    rel_names = kg.relations.column("name").to_pylist()
    keys = set(zip(src.tolist(), rel.tolist(), dst.tolist()))
    removed_node = 17
    lines = ["head\trelation\ttail\top"]
    gone = [i for i in rng.choice(len(src), 12, replace=False).tolist() if removed_node not in (src[i], dst[i])]
    for i in gone[:8]:
        if (src[i], rel[i], dst[i]) in keys:
            keys.discard((src[i], rel[i], dst[i]))
            lines.append(f"{names[src[i]]}\t{rel_names[rel[i]]}\t{names[dst[i]]}\tremove")
    added = 0
    while added < 8:
        s, d, r = (int(x) for x in (rng.integers(0, 300), rng.integers(0, 300), rng.integers(0, 4)))
        if (s, r, d) in keys or removed_node in (s, d):
            continue
        keys.add((s, r, d))
        lines.append(f"{names[s]}\t{rel_names[r]}\t{names[d]}\tadd")
        added += 1
    lines.append(f"brand new thing\t{rel_names[0]}\t{names[3]}\tadd")
    (root / "triples.tsv").write_text("\n".join(lines) + "\n")
    edited = [5, 40, 41, 120, 250]
    node_rows = ["name,text,op"] + [f"{names[i]},{names[i]} rewritten as something else,add" for i in edited]
    node_rows += [f"{names[removed_node]},,remove", "brand new thing,a brand new thing,add"]
    (root / "nodes.csv").write_text("\n".join(node_rows) + "\n")
    queries = kg.queries
    q_ids = queries.column("id").to_numpy()
    query_rows = ["id,text,answers,split,op", f"{q_ids[1]},,,,remove", f"{q_ids[4]},,,,remove"]
    query_rows += [
        f",what is related to {names[7]},{names[8]},train,add",
        f",what is related to brand new thing,{names[3]},val,add",
        f",which thing is {names[41]},{names[41]},test,add",
    ]
    (root / "queries.csv").write_text("\n".join(query_rows) + "\n")
    update_dataset(
        parent, root / "v2", triples_path=root / "triples.tsv", nodes_path=root / "nodes.csv", queries_path=root / "queries.csv"
    )
    return root / "v2"


def stage_manifest(directory: Path, name: str, info: dict | None = None, layout: dict | None = None) -> None:
    write_manifest(directory, {"stage": name, "fingerprint": name, "layout": layout or {}, "info": info or {}})


def full_run(dataset: Path, out: Path, config) -> Path:
    """Every stage of a full run in this process, with the library's stage functions (no Ray)."""
    kg = open_dataset(dataset)
    inputs = pp.embed_inputs(kg)
    encoder = load_encoder(config.embed)
    collector = pp.ShardCollector(out / "embed", {k: len(v[0]) for k, v in inputs.items()}, SHARD_ROWS)
    for kind_index, kind in enumerate(pp.KINDS):
        ids, texts = inputs[kind]
        rows = np.arange(len(ids))
        collector.add(np.full(len(ids), kind_index), rows, ids, encoder.encode(texts.to_pylist()))
    pp.finish_embed(out / "embed", kg)
    stage_manifest(out / "embed", "embed", layout={"shard_rows": SHARD_ROWS})
    (out / "features").mkdir()
    stage_manifest(out / "features", "features", pp.run_features(out / "embed", out / "features", kg, config))
    (out / "seeds").mkdir()
    stage_manifest(out / "seeds", "seeds", pp.run_seeds(out / "features", out / "seeds", kg, config))
    if config.expand.relation_score == "learned":
        (out / "paths").mkdir()
        table, _ = pp.paths_block(str(dataset), str(out), pp.train_query_ids(kg), to_dict(config))
        pq.write_table(table, out / "paths" / "part-000000.parquet")
        stage_manifest(out / "paths", "paths")
        (out / "prior").mkdir()
        pp.run_prior(out, out / "prior", kg, config, echo=lambda line: None)
        stage_manifest(out / "prior", "prior")
    (out / "subgraphs").mkdir()
    table, _ = pp.expand_block(str(dataset), str(out), np.load(out / "features" / "query_ids.npy"), to_dict(config))
    pq.write_table(table, out / "subgraphs" / "part-000000.parquet")
    stage_manifest(out / "subgraphs", "subgraphs")
    write_top_manifest(out, dataset, kg, config)
    return out


def write_top_manifest(out: Path, dataset: Path, kg, config) -> None:
    write_artifacts_manifest(out, dataset, kg, config, fingerprints=pp.stage_fingerprints(config, kg.fingerprint, kg.num_nodes))


def update_run(dataset: Path, parent_out: Path, out: Path, config, refit_prior: bool = False) -> dict:
    """The stages of ``pipelines/preprocess.py --update`` in this process: the same library calls, with
    the encoder in this process and the query blocks computed here. Returns what each stage recomputed."""
    kg = open_dataset(dataset)
    parent = open_artifacts(parent_out)
    inc.check_parent(kg, parent)
    config = inc.update_config(parent, None, [])
    diff = inc.diff_versions(parent.dataset, kg)
    table = inc.texts_to_embed(kg, diff)
    embedded = inc.EmbeddedRows(table)
    if table.num_rows:
        emb = load_encoder(config.embed).encode(table.column("text").to_pylist())
        embedded.add(table.column("kind").to_numpy(), table.column("row").to_numpy(), emb)
    for name in ("embed", "features", "seeds", "paths", "prior", "subgraphs"):
        (out / name).mkdir(parents=True, exist_ok=True)
    done = {"embed": inc.write_embed(parent_out / "embed", out / "embed", kg, diff, embedded, SHARD_ROWS)}
    done["features"] = inc.write_features(parent_out / "features", out / "embed", out / "features", kg, diff, config, SHARD_ROWS)
    done["seeds"] = inc.update_seeds(
        out / "features", out / "seeds", kg, parent.dataset, parent_out / "seeds" / "seeds.parquet", diff, config
    )
    seeds, reseeded = inc.changed_seeds(
        parent_out / "seeds" / "seeds.parquet", out / "seeds" / "seeds.parquet", diff, config.seed.k0
    )
    if config.expand.relation_score == "learned" and refit_prior:
        train = pp.train_query_ids(kg)
        current = inc.paths_searched_on(parent) == parent.dataset.fingerprint
        redo = inc.paths_to_recompute(kg, diff, config, seeds, reseeded) if current else train
        if len(redo):
            table, _ = pp.paths_block(str(dataset), str(out), redo, to_dict(config))
            pq.write_table(table, out / "paths" / "part-000000.parquet")
        inc.keep_golden_paths(parent_out / "paths", out / "paths", train, redo)
        stage_manifest(out / "paths", "paths", {"searched_on": kg.fingerprint})
        done["paths"] = {"recomputed": len(redo), "of": len(train)}
        pp.run_prior(out, out / "prior", kg, config, echo=lambda line: None)
    elif config.expand.relation_score == "learned":
        inc.copy_stage_files(parent_out / "paths", out / "paths")
        stage_manifest(out / "paths", "paths", {"searched_on": inc.paths_searched_on(parent)})
        done["paths"] = {"recomputed": 0}
        inc.copy_stage_files(parent_out / "prior", out / "prior")
    previous = SubgraphSet.read(parent_out / "subgraphs")
    ids = diff.query_ids
    if not refit_prior:
        ids, why = inc.subgraphs_to_recompute(kg, diff, config, previous, seeds, reseeded, parent.dataset, out / "features")
        done["why"] = why
    if len(ids):
        table, _ = pp.expand_block(str(dataset), str(out), ids, to_dict(config))
        pq.write_table(table, out / "subgraphs" / "part-000000.parquet")
    inc.keep_subgraphs(previous, out / "subgraphs", diff.query_ids, ids)
    done["subgraphs"] = {"recomputed": len(ids), "of": len(diff.query_ids)}
    for name in ("embed", "features", "seeds", "prior", "subgraphs"):  # complete, so that it can be a parent
        layout = {"shard_rows": SHARD_ROWS} if name == "embed" else None
        if any((out / name).iterdir()) and not (out / name / "manifest.json").exists():
            stage_manifest(out / name, name, layout=layout)
    return done


def assert_same_artifacts(a: Path, b: Path, learned: bool = False) -> None:
    for name in ("node", "relation", "query", "query_ids"):
        left, right = np.load(a / "features" / f"{name}.npy"), np.load(b / "features" / f"{name}.npy")
        assert left.shape == right.shape and np.array_equal(left, right), name
    for kind in ("nodes", "queries"):
        ids = pp.embed_inputs(open_dataset(json.loads((a / "manifest.json").read_text())["dataset"]))
        expected = ids["node" if kind == "nodes" else "query"][0]
        assert np.array_equal(pp.read_embeddings(a / "embed" / kind, expected), pp.read_embeddings(b / "embed" / kind, expected))
    assert np.array_equal(np.load(a / "embed" / "relations.npy"), np.load(b / "embed" / "relations.npy"))
    for left, right in zip(read_seed_table(a / "seeds" / "seeds.parquet"), read_seed_table(b / "seeds" / "seeds.parquet")):
        assert np.array_equal(left, right)
    if learned:
        assert pp.read_golden_paths(a / "paths").equals(pp.read_golden_paths(b / "paths"))
    assert SubgraphSet.read(a / "subgraphs").equals(SubgraphSet.read(b / "subgraphs"))


@pytest.fixture(scope="module")
def versions(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("versions")
    parent = write_tiny_dataset(root / "v1", 60, seed=11, two_hop_answers=True, id_stride=3)
    return Path(parent), write_change(root, Path(parent))


@pytest.mark.parametrize("strategy", ["dense", "dense+entity"])
def test_update_equals_a_full_run_without_pca(versions, tmp_path, strategy):
    parent, child = versions
    config = config_for(strategy)
    full_run(parent, tmp_path / "a1", config)
    done = update_run(child, tmp_path / "a1", tmp_path / "a2", config)
    full_run(child, tmp_path / "full", config)
    write_top_manifest(tmp_path / "a2", child, open_dataset(child), config)
    assert_same_artifacts(tmp_path / "a2", tmp_path / "full")
    kg = open_dataset(child)
    embedded = sum(done["embed"]["embedded"].values())
    assert 0 < embedded < kg.num_nodes // 10
    assert 0 < done["seeds"]["recomputed"] < kg.queries.num_rows
    assert 0 < done["subgraphs"]["recomputed"] < kg.queries.num_rows


def test_update_with_a_learned_prior(versions, tmp_path):
    """A kept prior keeps its golden paths (its training data); a refit searches the ones the change
    reaches again, and then the paths, the prior and its subgraphs are a full run's. After an update
    that kept them, a refit searches every path again: the kept ones were searched on an older graph."""
    parent, child = versions
    config = config_for("dense", learned=True)
    full_run(parent, tmp_path / "a1", config)
    full_run(child, tmp_path / "full", config)
    kept = update_run(child, tmp_path / "a1", tmp_path / "kept", config)
    write_top_manifest(tmp_path / "kept", child, open_dataset(child), config)
    assert kept["paths"]["recomputed"] == 0
    assert pp.read_golden_paths(tmp_path / "kept" / "paths").equals(pp.read_golden_paths(tmp_path / "a1" / "paths"))
    assert inc.paths_searched_on(open_artifacts(tmp_path / "kept")) == open_dataset(parent).fingerprint
    refit = update_run(child, tmp_path / "a1", tmp_path / "refit", config, refit_prior=True)
    train = len(pp.train_query_ids(open_dataset(child)))
    assert 0 < refit["paths"]["recomputed"] < train
    assert refit["subgraphs"]["recomputed"] == open_dataset(child).queries.num_rows
    write_top_manifest(tmp_path / "refit", child, open_dataset(child), config)
    assert_same_artifacts(tmp_path / "refit", tmp_path / "full", learned=True)

    third = edges_only_change(tmp_path, child)
    full_run(third, tmp_path / "full3", config)
    chained = update_run(third, tmp_path / "kept", tmp_path / "refit3", config, refit_prior=True)
    assert chained["paths"]["recomputed"] == len(pp.train_query_ids(open_dataset(third)))
    write_top_manifest(tmp_path / "refit3", third, open_dataset(third), config)
    assert_same_artifacts(tmp_path / "refit3", tmp_path / "full3", learned=True)


def test_update_keeps_the_pca(versions, tmp_path):
    """With a PCA the parent's is kept: unchanged rows are the parent's, changed ones its projection."""
    parent, child = versions
    config = config_for("dense", reduce_dim=8)
    full_run(parent, tmp_path / "a1", config)
    done = update_run(child, tmp_path / "a1", tmp_path / "a2", config)
    assert done["features"]["pca"] == "kept from the parent artifacts"
    assert (tmp_path / "a2" / "features" / "pca.npz").read_bytes() == (tmp_path / "a1" / "features" / "pca.npz").read_bytes()
    diff = inc.diff_versions(open_dataset(parent), open_dataset(child))
    same = np.flatnonzero(diff.node_source >= 0)
    new, old = np.load(tmp_path / "a2" / "features" / "node.npy"), np.load(tmp_path / "a1" / "features" / "node.npy")
    assert np.array_equal(new[same], old[diff.node_source[same]])


def test_an_update_writes_the_bfloat16_copy_as_a_full_run_and_refuses_to_cross_its_threshold(versions, tmp_path):
    """A parent with the bfloat16 copy (``reduce.bfloat16_from_nodes``): the update's copy and subgraphs
    equal a full run's. A version whose node count crosses the threshold is refused, naming the fix."""
    parent, child = versions
    config = config_for("dense", extra=("reduce.bfloat16_from_nodes=1",))
    full_run(parent, tmp_path / "a1", config)
    update_run(child, tmp_path / "a1", tmp_path / "a2", config)
    full_run(child, tmp_path / "full", config)
    write_top_manifest(tmp_path / "a2", child, open_dataset(child), config)
    assert_same_artifacts(tmp_path / "a2", tmp_path / "full")
    copies = [np.load(tmp_path / run / "features" / bfloat16.FILE_NAME) for run in ("a2", "full")]
    assert copies[0].dtype == np.uint16 and np.array_equal(*copies)
    crossing = config_for("dense", extra=(f"reduce.bfloat16_from_nodes={open_dataset(child).num_nodes}",))
    full_run(parent, tmp_path / "b1", crossing)  # fewer nodes than the threshold: no copy
    with pytest.raises(DataError, match="across reduce.bfloat16_from_nodes=.* run a full preprocessing"):
        update_run(child, tmp_path / "b1", tmp_path / "b2", crossing)


def test_update_refuses_the_wrong_parent_and_another_config(versions, tmp_path):
    parent, child = versions
    config = config_for("dense")
    full_run(child, tmp_path / "own", config)  # artifacts of the new version itself, not of its parent
    with pytest.raises(DataError, match=r"manifest.json: built from dataset fingerprint .* pass the artifacts of that parent"):
        inc.check_parent(open_dataset(child), open_artifacts(tmp_path / "own"))
    full_run(parent, tmp_path / "a1", config)
    with pytest.raises(DataError, match=r"the overrides expand.budget=25: differs from the config .* in the subgraphs stage"):
        inc.update_config(open_artifacts(tmp_path / "a1"), None, ["expand.budget=25"])
    with pytest.raises(DataError, match=r"records no parent version"):
        inc.check_parent(open_dataset(parent), open_artifacts(tmp_path / "a1"))
    assert inc.update_config(open_artifacts(tmp_path / "a1"), None, ["embed.batch_size=7"]).embed.batch_size == 7


def test_diff_counts(versions):
    parent, child = versions
    diff = inc.diff_versions(open_dataset(parent), open_dataset(child))
    assert diff.counts["edges_added"] >= 9 and diff.counts["edges_removed"] >= 8
    assert diff.counts["nodes_changed"] == 5 + 1 + 1  # edited, removed (its placeholder text), added
    assert diff.counts["queries_removed"] == 2
    assert pa.array(diff.query_ids).type == pa.int64()


def edges_only_change(root: Path, parent: Path, new_relation: bool = False) -> Path:
    """A new version whose change set only adds and removes triples (nothing to embed), optionally
    with a triple of a relation the parent does not have."""
    kg = open_dataset(parent)
    names = kg.node_names.to_pylist()
    rel_names = kg.relations.column("name").to_pylist()
    edges = kg.table("edges").slice(0, 3).to_pydict()
    lines = ["head\trelation\ttail\top"]
    lines += [f"{names[s]}\t{rel_names[r]}\t{names[d]}\tremove" for s, d, r in zip(edges["src"], edges["dst"], edges["relation"])]
    existing = set(zip(kg.table("edges").column("src").to_pylist(), kg.table("edges").column("dst").to_pylist()))
    pairs = [(s, d) for s in range(5, 40) for d in range(60, 90) if (s, d) not in existing and (d, s) not in existing][:3]
    lines += [f"{names[s]}\t{rel_names[0]}\t{names[d]}\tadd" for s, d in pairs]
    if new_relation:
        lines.append(f"{names[1]}\ta brand new relation\t{names[2]}\tadd")
    (root / "edges_only.tsv").write_text("\n".join(lines) + "\n")
    update_dataset(parent, root / "v3", triples_path=root / "edges_only.tsv")
    return root / "v3"


def test_an_update_of_edges_only_embeds_nothing_and_equals_a_full_run(versions, tmp_path):
    parent, _ = versions
    child = edges_only_change(tmp_path, parent)
    config = config_for("dense")
    full_run(parent, tmp_path / "a1", config)
    done = update_run(child, tmp_path / "a1", tmp_path / "a2", config)
    assert sum(done["embed"]["embedded"].values()) == 0
    full_run(child, tmp_path / "full", config)
    write_top_manifest(tmp_path / "a2", child, open_dataset(child), config)
    assert_same_artifacts(tmp_path / "a2", tmp_path / "full")


def random_edges_change(root: Path, parent: Path, seed: int, count: int) -> Path:
    """A new version with ``count`` random triples removed and ``count`` added between random nodes."""
    kg = open_dataset(parent)
    rng = np.random.default_rng(seed)
    names = kg.node_names.to_pylist()
    rel_names = kg.relations.column("name").to_pylist()
    edges = kg.table("edges")
    triples = sorted(set(zip(*(edges.column(c).to_pylist() for c in ("src", "relation", "dst")))))
    lines = ["head\trelation\ttail\top"]
    for i in rng.choice(len(triples), count, replace=False).tolist():
        s, r, d = triples[i]
        lines.append(f"{names[s]}\t{rel_names[r]}\t{names[d]}\tremove")
    existing, added = set(triples), 0
    while added < count:
        s, r, d = (
            int(x) for x in (rng.integers(0, kg.num_nodes), rng.integers(0, len(rel_names)), rng.integers(0, kg.num_nodes))
        )
        if s != d and (s, r, d) not in existing:
            existing.add((s, r, d))
            lines.append(f"{names[s]}\t{rel_names[r]}\t{names[d]}\tadd")
            added += 1
    (root / f"edges-{seed}.tsv").write_text("\n".join(lines) + "\n")
    update_dataset(parent, root / f"edges-{seed}", triples_path=root / f"edges-{seed}.tsv")
    return root / f"edges-{seed}"


def test_changed_edges_are_tested_one_by_one_and_the_update_still_equals_a_full_run(versions, tmp_path):
    """With the cosine score each changed edge is tested against the kept scores of the regions that
    read it, so fewer subgraphs are extracted again than by its endpoints alone; with hubs sampled
    below their degree and a candidate cap that cuts some hops, every update still equals a full run."""
    parent, _ = versions
    config = config_for("dense", extra=("expand.neighbor_cap=12", "expand.candidate_cap=60"))
    full_run(parent, tmp_path / "a1", config)
    previous = SubgraphSet.read(tmp_path / "a1" / "subgraphs")
    for seed in range(4):
        child = random_edges_change(tmp_path, parent, seed, count=10)
        done = update_run(child, tmp_path / "a1", tmp_path / f"update-{seed}", config)
        full_run(child, tmp_path / f"full-{seed}", config)
        kg = open_dataset(child)
        write_top_manifest(tmp_path / f"update-{seed}", child, kg, config)
        assert_same_artifacts(tmp_path / f"update-{seed}", tmp_path / f"full-{seed}")
        diff = inc.diff_versions(open_dataset(parent), kg)
        seeds, reseeded = inc.changed_seeds(
            tmp_path / "a1" / "seeds" / "seeds.parquet", tmp_path / f"update-{seed}" / "seeds" / "seeds.parquet", diff, 2
        )
        by_endpoints, _ = inc.subgraphs_to_recompute(kg, diff, config, previous, seeds, reseeded)
        assert 0 < done["subgraphs"]["recomputed"] < len(by_endpoints), (seed, done["subgraphs"], len(by_endpoints))


def test_an_edges_only_update_keeps_the_ann_indexs_seeds_and_equals_a_full_run(versions, tmp_path):
    """Seeding reads no edge: with an ANN index, an update that changes only edges keeps every seed,
    and one that edits texts seeds every question again; both equal a full run."""
    parent, texts_edited = versions
    edges_only = edges_only_change(tmp_path, parent)
    config = config_for("dense", extra=("seed.search=ann", "seed.ann_nlist=4", "seed.ann_nprobe=4"))
    full_run(parent, tmp_path / "a1", config)
    for name, child, recomputed in (
        ("edges", edges_only, 0),
        ("texts", texts_edited, open_dataset(texts_edited).queries.num_rows),
    ):
        done = update_run(child, tmp_path / "a1", tmp_path / f"{name}-update", config)
        assert done["seeds"]["search"] == "ann" and done["seeds"]["recomputed"] == recomputed, done["seeds"]
        full_run(child, tmp_path / f"{name}-full", config)
        write_top_manifest(tmp_path / f"{name}-update", child, open_dataset(child), config)
        assert_same_artifacts(tmp_path / f"{name}-update", tmp_path / f"{name}-full")


def test_a_new_relation_needs_the_prior_fitted_again(versions, tmp_path):
    parent, _ = versions
    child = edges_only_change(tmp_path, parent, new_relation=True)
    config = config_for("dense", learned=True)
    full_run(parent, tmp_path / "a1", config)
    with pytest.raises(DataError, match=r"adds 1 relation\(s\).*pass --refit-prior"):
        inc.check_kept_prior(open_dataset(child), open_artifacts(tmp_path / "a1"), config, refit_prior=False)
    inc.check_kept_prior(open_dataset(child), open_artifacts(tmp_path / "a1"), config, refit_prior=True)


def test_every_question_whose_entity_links_change_is_seeded_again_and_few_others(versions, tmp_path):
    """Brute force: both versions' linkers link every kept question; those linked differently are all
    among the ones the update screens in (by name, without linking), and the screen leaves most alone.
    The change removes a node that questions name, adds one named inside another question's entity name
    and adds a question that names two entities (the counts that rank mentions change)."""
    from seeder.retrieve.seeds import EntityLinker, normalise_texts

    parent, _ = versions
    parent_kg = open_dataset(parent)
    texts = parent_kg.queries.column("text").to_pylist()
    named = lambda text: text.removeprefix("what is related to ")  # noqa: E731
    (tmp_path / "nodes.csv").write_text(f"name,text,op\n{named(texts[0])},,remove\n{named(texts[1]).rsplit(' ', 1)[0]},new,add\n")
    answer = parent_kg.node_names[0].as_py()
    (tmp_path / "queries.csv").write_text(
        f"id,text,answers,split,op\n,what is related to {named(texts[2])} and {named(texts[3])},{answer},train,add\n"
    )
    update_dataset(parent, tmp_path / "v2", nodes_path=tmp_path / "nodes.csv", queries_path=tmp_path / "queries.csv")
    kg = open_dataset(tmp_path / "v2")
    seed_config = config_for("dense+entity").seed
    diff = inc.diff_versions(parent_kg, kg)
    linker = EntityLinker(kg, seed_config)
    texts = kg.table("queries", ["id", "text"]).sort_by("id").column("text").combine_chunks()
    screened = inc.mention_any(normalise_texts(texts), inc.names_to_relink(kg, parent_kg, diff, linker, texts))
    kept = np.flatnonzero(diff.query_source >= 0)
    kept_texts = texts.take(pa.array(kept)).to_pylist()
    new, old = linker.link(kept_texts), EntityLinker(parent_kg, seed_config).link(kept_texts)
    differ = np.array([not np.array_equal(a, b) for a, b in zip(new, old)])
    assert differ.sum() >= 2, "the change set must change the links of the questions naming the two nodes"
    assert screened[kept][differ].all(), [kept_texts[i] for i in np.flatnonzero(differ & ~screened[kept])]
    assert screened[kept].mean() < 0.25


def test_a_prior_that_reads_masked_questions_keeps_what_it_read_and_an_update_that_edits_questions_refits_it(versions, tmp_path):
    """``prior.question: masked``: the prior stage embeds every question with its seeds' names masked and
    keeps those rows beside the prior; the subgraphs stage reads them (a question the prior never read is
    an error, not the text's features). A kept prior cannot read the questions an update edits or adds:
    the update asks for ``--refit-prior``, and a refit equals a full run."""
    from seeder.config import ConfigError
    from seeder.features.embed import apply_pca
    from seeder.retrieve.answer_type import asked_types, asked_words, one_hot
    from seeder.retrieve.khop import expand_queries
    from seeder.retrieve.local_match import question_windows
    from seeder.retrieve.prior import RelationPathPrior
    from seeder.retrieve.wording import masked_questions, seed_names

    parent, child = versions
    config = config_for("dense+entity", learned=True, extra=("prior.question=masked",))
    out = full_run(parent, tmp_path / "a1", config)
    kg = open_dataset(parent)
    assert RelationPathPrior.load(out / "prior").question == "masked"
    # It also wrote its vocabulary as questions (seeder.retrieve.path_text), with the weight it chose.
    # What it read of each question closes with the one-hot type the question asks for
    # (seeder.retrieve.answer_type), after the masked question's features.
    stored = RelationPathPrior.load(out / "prior")
    text, asks = stored.path_text, stored.answer_types
    ids, read = np.load(out / "prior" / "question_ids.npy"), np.load(out / "prior" / "question.npy")
    windows = stored.local_match  # then the seed and asking windows (seeder.retrieve.local_match)
    assert asks is not None and asks.offset == text.dim and windows.offset == text.dim + len(asks.names)
    assert read.shape[1] == windows.offset + 2 * text.dim
    assert text.paths.shape[0] == len(asks.path_types) == len(stored.vocab)
    assert json.loads((out / "prior" / "prior.json").read_text())["path_text_weight"] == text.weight
    seed_ids, seeds, _ = read_seed_table(out / "seeds" / "seeds.parquet")
    assert np.array_equal(ids, np.sort(kg.queries.column("id").to_numpy())) and np.array_equal(ids, seed_ids)
    texts = kg.queries.column("text").take(pa.array(kg.query_rows(ids))).to_pylist()
    types = seed_names(kg.node_types, seeds)
    masked = masked_questions(texts, seed_names(kg.node_names, seeds), types)
    assert sum(f"the {t[0]}" in m for m, t in zip(masked, types)) >= len(masked) // 2  # each seed named by its type
    encoder = load_encoder(config.embed)
    np.testing.assert_array_equal(read[:, : text.dim], apply_pca(encoder.encode(masked), None))  # reduce.dim=0
    asked = asked_types(asked_words(texts), encoder.encode, asks.names)
    np.testing.assert_array_equal(read[:, text.dim : windows.offset], one_hot(asked, len(asks.names)))
    seed_side, asking = question_windows(texts, seed_names(kg.node_names, seeds), types)
    for window, block in zip(
        (seed_side, asking), (read[:, windows.columns][:, : text.dim], read[:, windows.columns][:, text.dim :])
    ):
        filled = np.flatnonzero(np.asarray(window, dtype=object) != "")
        assert len(filled) > len(window) // 2 and not block[np.setdiff1d(np.arange(len(window)), filled)].any()
        np.testing.assert_allclose(block[filled], encoder.encode([window[i] for i in filled]), atol=1e-5)
    assert not np.allclose(read[:, : text.dim], np.load(out / "features" / "query.npy"))

    prior = RelationPathPrior.load(out / "prior")
    with pytest.raises(ConfigError, match="masked"):
        expand_queries(
            kg, np.load(out / "features" / "node.npy"), np.load(out / "features" / "relation.npy"), read[:2], seeds[:2],
            np.zeros((2, seeds.shape[1])), config.expand, ids[:2], np.array(["val"] * 2, dtype=object),
            np.zeros(3, np.int64), np.zeros(0, np.int64), prior=prior,
        )  # fmt: skip
    with pytest.raises(DataError, match="--refit-prior"):
        pp.prior_question_rows(out / "prior", np.array([ids[0], ids[-1] + 1]))

    # A new question is read the same way: the Retriever masks and encodes it, and gets the stored subgraph.
    from seeder import Retriever
    from seeder.policy.checkpoint import artifacts_record
    from seeder.training.loop import build_state, export_best

    trained = dataclasses.replace(config, model=dataclasses.replace(config.model, hidden_dim=16, num_layers=1))
    feature_dim = np.load(out / "features" / "query.npy").shape[1]
    model = export_best(build_state(trained, feature_dim, 1, artifacts_record(open_artifacts(out))), tmp_path / "model")
    retriever = Retriever.load(model, artifacts=out)
    _, stored = retriever.rank_split("val")
    text_of = dict(zip(ids.tolist(), texts))
    online, _ = retriever.subgraphs([text_of[q] for q in stored.query_ids.tolist()])
    np.testing.assert_array_equal(online.nodes, stored.nodes)
    np.testing.assert_allclose(online.path_end, stored.path_end, rtol=1e-5)  # the prior read the same

    diff = inc.diff_versions(kg, open_dataset(child))
    with pytest.raises(DataError, match="--refit-prior"):
        inc.check_kept_masked_prior(open_dataset(child), open_artifacts(out), config, diff)
    refit = update_run(child, tmp_path / "a1", tmp_path / "refit", config, refit_prior=True)
    assert refit["subgraphs"]["recomputed"] == open_dataset(child).queries.num_rows
    full_run(child, tmp_path / "full", config)
    write_top_manifest(tmp_path / "refit", child, open_dataset(child), config)
    assert_same_artifacts(tmp_path / "refit", tmp_path / "full", learned=True)
    for name in ("question.npy", "question_ids.npy"):
        assert np.array_equal(np.load(tmp_path / "refit" / "prior" / name), np.load(tmp_path / "full" / "prior" / name))
