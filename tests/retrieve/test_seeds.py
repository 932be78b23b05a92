"""Exact blocked top-k seeds (screened in float32 or bfloat16), entity linking and the seeding strategies."""

from __future__ import annotations

import sys

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seeder.config import ConfigError, SeedConfig
from seeder.features.bfloat16 import to_bfloat16_bits
from seeder.retrieve import topk
from seeder.retrieve.seeds import EntityLinker, dense_seeds, normalise_texts, resolve_screen, row_cosines, select_seeds

from .conftest import make_graph, normalised


def brute_force_topk(qf, nf, k):
    scores = qf @ nf.T
    order = np.lexsort((np.broadcast_to(np.arange(len(nf)), scores.shape), -scores), axis=-1)[:, :k]
    return order, np.take_along_axis(scores, order, axis=1)


@pytest.mark.parametrize("block_nodes,block_queries", [(7, 3), (50, 64), (1000, 1)])
def test_blocked_topk_equals_brute_force(block_nodes, block_queries):
    rng = np.random.default_rng(1)
    nf, qf = normalised(rng, 200, 12), normalised(rng, 9, 12)
    ids, scores = dense_seeds(qf, nf, 5, block_nodes, block_queries)
    want_ids, want_scores = brute_force_topk(qf, nf, 5)
    assert ids.dtype == np.int64 and scores.dtype == np.float32
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(scores, want_scores, atol=1e-6)


@pytest.mark.parametrize("block_nodes,block_queries", [(64, 7), (1000, 64)])
def test_a_bfloat16_screen_finds_the_same_seeds_bit_for_bit_among_near_ties(block_nodes, block_queries):
    """Nodes that differ from each other by 1e-4, far below bfloat16's resolution (about 4e-3 here):
    the screen cannot order them, the exact re-scoring does, so both screens give the brute-force top-k
    of the exact per-pair scores."""
    rng = np.random.default_rng(5)
    centres = normalised(rng, 6, 32)
    nf = centres[rng.integers(0, 6, 700)] + 1e-4 * rng.standard_normal((700, 32)).astype(np.float32)
    nf /= np.linalg.norm(nf, axis=1, keepdims=True)
    nf[[20, 333, 334, 650]] = nf[19]  # exact ties too, across blocks
    qf = np.concatenate([centres + 1e-3 * normalised(rng, 6, 32), nf[[19, 400]], normalised(rng, 4, 32)])
    qf /= np.linalg.norm(qf, axis=1, keepdims=True)
    k = 5
    rows = np.repeat(np.arange(len(qf)), len(nf))
    exact = row_cosines(qf, nf, rows, np.tile(np.arange(len(nf)), len(qf))).reshape(len(qf), len(nf))
    want = np.lexsort((np.broadcast_to(np.arange(len(nf)), exact.shape), -exact), axis=-1)[:, :k]
    got = {screen: dense_seeds(qf, nf, k, block_nodes, block_queries, screen=screen) for screen in ("float32", "bfloat16")}
    # Screening the features' bfloat16 copy instead of the float32 rows changes nothing either.
    copy = to_bfloat16_bits(nf)
    for screen in ("float32", "bfloat16"):
        got[f"{screen} over the copy"] = dense_seeds(qf, nf, k, block_nodes, block_queries, screen=screen, screen_rows=copy)
    for ids, scores in got.values():
        np.testing.assert_array_equal(ids, want)
        np.testing.assert_array_equal(scores, np.take_along_axis(exact, want, axis=1))
    assert got["bfloat16"][0][6].tolist() == [19, 20, 333, 334, 650]
    with pytest.raises(ConfigError, match="seed.screen='float16': choose auto, float32 or bfloat16"):
        resolve_screen("float16")
    with pytest.raises(ValueError, match="screen_rows must be the node features' bfloat16 bits"):
        dense_seeds(qf, nf, k, screen_rows=nf)


def test_the_bfloat16_copys_rounding_bound_is_what_keeps_its_screen_exact(monkeypatch):
    """Without its rounding bound the float32 screen over the bfloat16 copy drops true seeds: nodes a
    rounding step apart are ordered by the copy, not by their float32 rows."""
    rng = np.random.default_rng(11)
    base = normalised(rng, 1, 32)[0]
    nf = base + 1e-3 * rng.standard_normal((400, 32)).astype(np.float32)
    nf /= np.linalg.norm(nf, axis=1, keepdims=True)
    qf = normalised(rng, 1, 32) * 0.1 + base
    qf /= np.linalg.norm(qf, axis=1, keepdims=True)
    want, _ = dense_seeds(qf, nf, 5, 50, 1, screen="float32")
    copy = to_bfloat16_bits(nf)
    np.testing.assert_array_equal(dense_seeds(qf, nf, 5, 50, 1, screen="float32", screen_rows=copy)[0], want)
    monkeypatch.setattr(topk, "BF16_ROWS_ROUNDING", 0.0)
    assert not np.array_equal(dense_seeds(qf, nf, 5, 50, 1, screen="float32", screen_rows=copy)[0], want)


def test_ties_across_block_boundaries_break_by_id():
    rng = np.random.default_rng(2)
    base = normalised(rng, 1, 6)[0]
    nf = normalised(rng, 40, 6)
    # Nodes 3, 11, 12, 25 and 38 are identical, spread over blocks of 8, and the best match.
    for i in (38, 25, 12, 11, 3):
        nf[i] = base
    qf = base[None, :]
    for block in (8, 5, 40):
        ids, scores = dense_seeds(qf, nf, 4, block_nodes=block, block_queries=1)
        assert ids[0].tolist() == [3, 11, 12, 25]
        assert np.all(scores[0] == scores[0, 0])


def test_fewer_nodes_than_k_pads():
    rng = np.random.default_rng(3)
    nf, qf = normalised(rng, 3, 4), normalised(rng, 2, 4)
    ids, scores = dense_seeds(qf, nf, 5, block_nodes=2, block_queries=1)
    assert (ids[:, 3:] == -1).all() and np.isinf(scores[:, 3:]).all()
    assert sorted(ids[0, :3].tolist()) == [0, 1, 2]


def test_memmap_node_features(tmp_path):
    rng = np.random.default_rng(4)
    nf, qf = normalised(rng, 100, 8), normalised(rng, 4, 8)
    np.save(tmp_path / "node.npy", nf)
    mm = np.load(tmp_path / "node.npy", mmap_mode="r")
    np.testing.assert_array_equal(dense_seeds(qf, mm, 3, 16, 2)[0], brute_force_topk(qf, nf, 3)[0])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status (Linux)")
def test_memmapped_features_do_not_stay_resident(tmp_path):
    """The search reads the features once, block by block, and lets each block go: at ten million nodes
    they are 10 GB, which would otherwise count in every seeding process's resident set."""
    from seeder.system.mapped import file_resident_bytes

    rng = np.random.default_rng(6)
    nf = normalised(rng, 32_768, 256)  # 32 MB
    qf = normalised(rng, 5, 256)
    np.save(tmp_path / "node.npy", nf)
    mm = np.load(tmp_path / "node.npy", mmap_mode="r")
    before = file_resident_bytes()
    ids, _ = dense_seeds(qf, mm, 3, block_nodes=2048, block_queries=2)
    assert file_resident_bytes() - before < 8 << 20  # at most a block or two of 2 MB, not 32 MB
    np.testing.assert_array_equal(ids, brute_force_topk(qf, nf, 3)[0])


def test_entity_linking_plain_text(tmp_path):
    names = [
        "The Matrix",
        "Matrix",
        "Keanu Reeves",
        "Reeves",
        "It",
        "The Matrix Reloaded",
        "Lana  Wachowski!",
        "What?",
        "The Who",
    ]
    kg = make_graph(tmp_path / "kg", [0], [2], [0], len(names), 1, names=names)
    linker = EntityLinker(kg, SeedConfig(entity_min_chars=3, entity_max=3))
    found = linker.link(
        [
            "who starred in the matrix reloaded with keanu reeves",
            "what did it do",  # "It" is shorter than entity_min_chars, "What?" only a stop word
            "films by lana wachowski, and the MATRIX?",
            "nothing here",
        ]
    )
    assert found[0].tolist() == [5, 2]  # longest mention first; "matrix" inside it is not re-used
    assert found[1].tolist() == []
    assert EntityLinker(kg, SeedConfig()).link(["the who played what"])[0].tolist() == []  # stop words only
    assert found[2].tolist() == [6, 0]
    assert found[3].dtype == np.int64 and len(found[3]) == 0
    capped = EntityLinker(kg, SeedConfig(entity_max=1)).link(["keanu reeves in the matrix"])
    assert capped[0].tolist() == [2]


def test_select_seeds_strategies():
    dense_ids = np.array([[4, 5, 6], [7, 8, -1]])
    dense_scores = np.array([[0.9, 0.8, 0.7], [0.6, 0.5, -np.inf]], np.float32)
    linked = [np.array([6, 1]), np.array([], np.int64)]
    ids, scores = select_seeds(SeedConfig(k0=3, strategy="dense"), dense_ids, dense_scores, None)
    np.testing.assert_array_equal(ids, dense_ids)
    ids, scores = select_seeds(SeedConfig(k0=3, strategy="dense+entity"), dense_ids, dense_scores, linked)
    assert ids.tolist() == [[6, 1, 4], [7, 8, -1]]
    assert scores[0, 2] == np.float32(0.9) and np.isnan(scores[0, 0])
    ids, _ = select_seeds(SeedConfig(k0=3, strategy="entity"), dense_ids, dense_scores, linked)
    assert ids.tolist() == [[6, 1, -1], [-1, -1, -1]]
    rng = np.random.default_rng(0)
    nf, qf = normalised(rng, 10, 4), normalised(rng, 2, 4)
    _, scores = select_seeds(SeedConfig(k0=2, strategy="entity"), dense_ids, dense_scores, linked, qf, nf)
    np.testing.assert_allclose(scores[0], [nf[6] @ qf[0], nf[1] @ qf[0]], rtol=1e-6)
    with pytest.raises(ConfigError, match="strategy"):
        select_seeds(SeedConfig(strategy="bm25"), dense_ids, dense_scores, None)
    with pytest.raises(ConfigError, match="EntityLinker"):
        select_seeds(SeedConfig(strategy="entity"), dense_ids, dense_scores, None)


def test_entity_linking_prefers_the_rarest_mention(tmp_path):
    """Question words that are also node names (MetaQA's tags "film", "director") lose to the entity
    the question is about, because they occur in many of the graph's questions."""
    names = ["film", "K2", "director", "Hotel"]
    texts = ["the film K2 was directed by who", "the film Hotel was directed by who", "which film has director Hotel"]
    queries = pa.table({"id": [0, 1, 2], "text": texts, "answers": [[0], [0], [0]], "split": ["val"] * 3})
    kg = make_graph(tmp_path / "kg", [0], [1], [0], len(names), 1, names=names, queries=queries)
    linker = EntityLinker(kg, SeedConfig(entity_min_chars=2, entity_max=1))
    assert dict(zip(linker.dictionary.to_pylist(), linker.query_counts.tolist())) == {
        "film": 3,
        "k2": 1,
        "hotel": 2,
        "director": 1,
    }
    found = linker.link(["the film K2 was directed by who", "the film Hotel was directed by who"])
    assert [f.tolist() for f in found] == [[1], [3]]
    # Equal counts: the longer, then the earlier mention wins.
    assert EntityLinker(kg, SeedConfig(entity_min_chars=2, entity_max=2)).link(["director of K2"])[0].tolist() == [2, 1]


def test_entity_scan_finds_every_name_a_word_ngram_spells(tmp_path):
    """The scan extends an n-gram only while it begins some name: it must still find every mention a
    plain scan of all n-grams finds, where names nest ("the matrix" in "the matrix reloaded") or share
    words without nesting ("new york city" holds "york" but not "new york")."""
    names = ["New York City", "york", "The Matrix", "the matrix reloaded", "Reloaded", "city lights", "x"]
    texts = [
        "who filmed the matrix reloaded in new york city",
        "new york at night",
        "city lights of york city",
        "the the matrix",
    ]
    queries = pa.table(
        {"id": list(range(len(texts))), "text": texts, "answers": [[0]] * len(texts), "split": ["val"] * len(texts)}
    )
    kg = make_graph(tmp_path / "kg", [0], [1], [0], len(names), 1, names=names, queries=queries)
    texts.append("")  # a question linked later may be empty; a dataset's may not
    linker = EntityLinker(kg, SeedConfig(entity_min_chars=2, entity_max=3))
    known = {name.lower() for name in names if len(name) >= 2}
    expected = {
        (row, start, n, " ".join(words[start : start + n]))
        for row, words in enumerate(text.split() for text in texts)
        for n in range(1, len(words) + 1)
        for start in range(len(words) - n + 1)
        if " ".join(words[start : start + n]) in known
    }
    row, start, length, code, num_words = linker._scan(pa.array(texts))
    spelled = linker.dictionary.take(pa.array(code)).to_pylist()
    assert set(zip(row.tolist(), start.tolist(), length.tolist(), spelled)) == expected
    assert len(row) == len(expected) and num_words.tolist() == [len(t.split()) for t in texts]
    assert [ids.tolist() for ids in linker.link(["the matrix reloaded in york"])] == [[3, 1]]


def test_given_seeds_read_the_topic_attribute_and_refuse_bad_ones(tmp_path):
    from seeder.retrieve.seeds import given_seeds
    from seeder.system.io import DataError

    queries = pa.table(
        {
            "id": np.array([5, 9, 12], np.int64),
            "text": ["about node 3", "about nothing", "about node 1"],
            "answers": [[0], [1], [2]],
            "split": ["train", "val", "test"],
            "topic_id": pa.array([3, None, 1], pa.int64()),
        }
    )
    kg = make_graph(tmp_path / "g", np.array([0, 1]), np.array([1, 2]), np.array([0, 0]), 4, 1, queries=queries)
    linked = given_seeds(kg, np.array([12, 5, 9]), "topic_id")
    assert [x.tolist() for x in linked] == [[1], [3], []]
    # The given node first, dense seeds fill the rest (and a query without a topic).
    ids, _ = select_seeds(SeedConfig(k0=2, strategy="dense+entity"), np.array([[2, 1], [0, 3], [2, 0]]), np.zeros((3, 2)), linked)
    assert ids.tolist() == [[1, 2], [3, 0], [2, 0]]
    with pytest.raises(ConfigError, match="lacks"):
        given_seeds(kg, np.array([5]), "topic")
    with pytest.raises(ConfigError, match="node ids"):
        given_seeds(kg, np.array([5]), "text")
    bad = queries.set_column(4, "topic_id", pa.array([3, 7, 1], pa.int64()))
    kg_bad = make_graph(tmp_path / "b", np.array([0, 1]), np.array([1, 2]), np.array([0, 0]), 4, 1, queries=bad)
    with pytest.raises(DataError, match="query 9 names node 7"):
        given_seeds(kg_bad, np.array([5, 9]), "topic_id")


def test_a_name_shared_by_several_nodes_links_the_one_spelled_as_in_the_question(tmp_path):
    """MetaQA keeps the person "Harry Connick Jr." and the tag "harry connick jr." apart by case alone."""
    names = ["Harry Connick Jr.", "harry connick jr.", "Hope Floats"]
    kg = make_graph(tmp_path / "kg", [2], [0], [0], len(names), 1, names=names)
    linker = EntityLinker(kg, SeedConfig(entity_max=1))
    found = linker.link(
        [
            "which movies can be described by harry connick jr.",
            "what did Harry Connick Jr. star in",
            "what did HARRY CONNICK JR star in",
        ]
    )
    assert [f.tolist() for f in found] == [[1], [0], [0]]  # no verbatim match: id order
    assert EntityLinker(kg, SeedConfig(entity_max=2)).link(pa.array(["harry connick jr. films"]))[0].tolist() == [1, 0]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(max_codepoint=127), max_size=40), min_size=1, max_size=5))
def test_the_python_path_for_a_few_ascii_texts_normalises_as_arrow_does(texts):
    # A short list of ASCII strings skips Arrow's Unicode regex; an Arrow array always takes it.
    assert normalise_texts(texts).to_pylist() == normalise_texts(pa.array(texts, type=pa.string())).to_pylist()


def test_non_ascii_and_long_inputs_go_through_arrow():
    texts = ["Amélie  (2001)", "Ünïcödé--Straße", "ΑΒΓ δ"]
    assert normalise_texts(texts).to_pylist() == ["amélie 2001", "ünïcödé straße", "αβγ δ"]
    many = ["What's THIS?"] * 100
    assert normalise_texts(many).to_pylist() == ["what s this"] * 100


def test_distinct_per_row_counts_each_id_once():
    from seeder.retrieve.seeds import distinct_per_row

    rows = [np.array([3, 3, 5]), np.zeros(0, np.int64), np.array([7]), np.array([1, 2, 1, 2, 9])]
    np.testing.assert_array_equal(distinct_per_row(rows, 4), [2, 0, 1, 3])
    np.testing.assert_array_equal(distinct_per_row([np.zeros(0, np.int64)] * 2, 2), [0, 0])
