"""Defaults derived from the training split (seeder.preprocessing.derive), on a synthetic graph with 3-hop questions."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa

from seeder.config import PriorConfig, SeederConfig, SynthConfig
from seeder.data.store import open_dataset, write_dataset
from seeder.generate.synth import generate
from seeder.preprocessing.derive import FRONTIER_FACTOR, STEP_MIN, derive_defaults, derive_unset, needs_derivation, step_budget


def _graph(tmp_path, name="g", mangle_held_out=False):
    nodes, relations, edges, queries = generate(
        SynthConfig(nodes=400, relations=4, max_path_length=3, queries=900, hubs=0, multi_answer_frac=0.0, seed=1)
    )
    if mangle_held_out:
        held_out = np.asarray(queries.column("split").to_pylist()) != "train"
        answers = [[0] if h else a for a, h in zip(queries.column("answers").to_pylist(), held_out)]
        queries = queries.set_column(
            queries.column_names.index("answers"), "answers", pa.array(answers, queries.schema.field("answers").type)
        )
    return open_dataset(write_dataset(tmp_path / name, nodes, relations, edges, queries))


def _features(kg, seed=0):
    rng = np.random.default_rng(seed)
    nf = rng.normal(size=(kg.num_nodes, 8)).astype(np.float32)
    qf = rng.normal(size=(kg.queries.num_rows, 8)).astype(np.float32)
    return nf / np.linalg.norm(nf, axis=1, keepdims=True), qf / np.linalg.norm(qf, axis=1, keepdims=True)


def test_derivation_reads_the_questions_needs_and_only_training_answers(tmp_path):
    kg = _graph(tmp_path)
    nf, qf = _features(kg)
    ids = np.sort(kg.queries.column("id").to_numpy())
    config = derive_unset(SeederConfig(), {})
    assert needs_derivation(config)
    resolved, lines = derive_defaults(kg, nf, qf, ids, config)
    # Questions name their start node verbatim, dense seeds (random features here) do not find it.
    assert resolved.seed.strategy == "dense+entity"
    assert resolved.expand.hops == 3  # a third of the questions need three relations
    assert len(resolved.expand.keep_per_hop) == 3
    assert sum(resolved.expand.keep_per_hop) == resolved.expand.budget - resolved.seed.k0
    # Every hop's path holds one node on a graph of permutations: an even split.
    assert max(resolved.expand.keep_per_hop) - min(resolved.expand.keep_per_hop) <= 2
    assert resolved.expand.relation_score == "learned"
    assert not needs_derivation(resolved)
    # One policy step per hop; a path of permutations reaches one node a hop: the smallest steps.
    assert resolved.train.expansion_sizes == [STEP_MIN] * 3
    assert resolved.train.frontier_caps == [FRONTIER_FACTOR * STEP_MIN] * 3
    assert resolved.prior.wording_dim == PriorConfig().wording_dim  # real questions: their wording is read
    assert len(lines) == 8 and all(line.startswith("auto: ") for line in lines)
    assert resolved.prior.question == "text"  # real questions: the prior reads them whole
    assert resolved.prior.vote == "off"  # all of them labelled: the prior learns from them directly
    # Val and test answers are never read.
    other = _graph(tmp_path, "mangled", mangle_held_out=True)
    again, _ = derive_defaults(other, nf, qf, ids, config)
    assert again == resolved


def test_generated_training_questions_turn_the_priors_wording_off_and_masking_on_unless_the_command_line_sets_them(
    tmp_path,
):
    nodes, relations, edges, queries = generate(
        SynthConfig(nodes=400, relations=4, max_path_length=3, queries=900, hubs=0, multi_answer_frac=0.0, seed=1)
    )
    marked = queries.append_column("generated", pa.array(np.asarray(queries.column("split").to_pylist()) == "train"))
    kg = open_dataset(write_dataset(tmp_path / "generated", nodes, relations, edges, marked))
    nf, qf = _features(kg)
    ids = np.sort(kg.queries.column("id").to_numpy())
    resolved, lines = derive_defaults(kg, nf, qf, ids, derive_unset(SeederConfig(), {}))
    assert resolved.prior.wording_dim == 0
    assert any(line.startswith("auto: prior.wording_dim=0 (1.00 of the training questions are generated") for line in lines)
    assert resolved.prior.question == "masked"
    assert any(line.startswith("auto: prior.question=masked (1.00 of the training questions are generated") for line in lines)
    assert resolved.prior.vote == "off"  # no labelled question to vote
    given = derive_unset(SeederConfig(), {"prior": {"question": "text"}})
    assert given.prior.question == "text"
    assert derive_defaults(kg, nf, qf, ids, given)[0].prior.question == "text"
    kept = derive_unset(SeederConfig(), {"prior": {"wording_dim": 64}})
    assert (
        derive_defaults(kg, nf, qf, ids, dataclasses.replace(kept, prior=dataclasses.replace(kept.prior, wording_dim=64)))[
            0
        ].prior.wording_dim
        == 64
    )


def test_a_few_labelled_questions_among_generated_ones_turn_the_vote_on(tmp_path):
    nodes, relations, edges, queries = generate(
        SynthConfig(nodes=400, relations=4, max_path_length=3, queries=900, hubs=0, multi_answer_frac=0.0, seed=1)
    )
    train = np.asarray(queries.column("split").to_pylist()) == "train"
    # Three labelled training questions, fewer than the derivation's sample would be likely to hold.
    generated = train & (np.cumsum(train) > 3)
    kg = open_dataset(
        write_dataset(tmp_path / "few", nodes, relations, edges, queries.append_column("generated", pa.array(generated)))
    )
    nf, qf = _features(kg)
    ids = np.sort(kg.queries.column("id").to_numpy())
    resolved, lines = derive_defaults(kg, nf, qf, ids, derive_unset(SeederConfig(), {}))
    assert resolved.prior.vote == "labelled"
    assert any(line.startswith(f"auto: prior.vote=labelled (3 of {int(train.sum()):,} training questions") for line in lines)
    given = derive_unset(SeederConfig(), {"prior": {"vote": "off"}})
    assert derive_defaults(kg, nf, qf, ids, given)[0].prior.vote == "off"


def test_the_step_budget_follows_the_nodes_each_hop_reaches_within_bounds():
    sizes, caps = step_budget(np.array([1.0, 9.2, 400.0]))
    assert sizes == [5, 10, 30]  # at least a few, the hop's nodes rounded up, at most a readable set
    assert caps == [25, 50, 150] and all(c >= s for c, s in zip(caps, sizes))


def test_wide_fan_out_questions_get_larger_steps(tmp_path):
    nodes, relations, edges, queries = generate(
        SynthConfig(
            nodes=600,
            relations=4,
            max_path_length=3,
            queries=900,
            hubs=0,
            multi_answer_frac=0.0,
            fanout_frac=1.0,
            multi_answer_fanout=3,
            seed=2,
        )
    )
    kg = open_dataset(write_dataset(tmp_path / "fan", nodes, relations, edges, queries))
    nf, qf = _features(kg)
    resolved, _ = derive_defaults(kg, nf, qf, np.sort(kg.queries.column("id").to_numpy()), derive_unset(SeederConfig(), {}))
    # Paths through "associate of" reach about 3, 9 and 27 nodes at hops 1, 2 and 3.
    assert resolved.expand.hops == 3
    sizes = resolved.train.expansion_sizes
    assert len(sizes) == 3 and sizes[0] == STEP_MIN and 7 <= sizes[1] <= 12 and sizes[2] >= 14


def test_the_command_line_overrides_a_derivation(tmp_path):
    kg = _graph(tmp_path)
    nf, qf = _features(kg)
    ids = np.sort(kg.queries.column("id").to_numpy())
    base = dataclasses.replace(SeederConfig(), expand=dataclasses.replace(SeederConfig().expand, keep_per_hop=[50, 150]))
    config = derive_unset(
        base,
        {
            "expand": {"keep_per_hop": [50, 150], "relation_score": "cosine"},
            "seed": {"strategy": "dense"},
            "prior": {"wording_dim": 1024, "question": "text", "vote": "off"},
        },
    )
    assert config.expand.hops == 2 and config.expand.relation_score == "cosine" and config.seed.strategy == "dense"
    assert not needs_derivation(config)
    resolved, lines = derive_defaults(kg, nf, qf, ids, config)
    assert resolved == config and lines == []


def test_hops_below_one_is_explained_as_hops_not_as_keep_per_hop():
    import pytest

    from seeder.config import ConfigError, load_config, parse_overrides
    from seeder.preprocessing.stages import check_config
    from seeder.retrieve.khop import _check_config

    def config(*overrides):
        return load_config(None, ["embed.encoder=hash", *overrides])

    with pytest.raises(
        ConfigError,
        match=r"^expand.hops must be >= 1, or 0 \(auto\) to derive it from the training "
        r"split together with expand.keep_per_hop=\[\]; got expand.hops=0 with "
        r"expand.keep_per_hop=\[60, 140\]$",
    ):
        check_config(config("expand.hops=0"))
    with pytest.raises(ConfigError, match=r"^expand.hops must be >= 1, .*; got expand.hops=-1 with"):
        check_config(config("expand.hops=-1"))
    check_config(config("expand.hops=0", "expand.keep_per_hop=[]"))  # auto: still means "derive"
    assert needs_derivation(config("expand.hops=0", "expand.keep_per_hop=[]"))
    # Without a config file, hops=0 on the command line is derived together with keep_per_hop.
    derived = derive_unset(config("expand.hops=0"), parse_overrides(["expand.hops=0"]))
    assert derived.expand.hops == 0 and derived.expand.keep_per_hop == []
    check_config(derived)
    with pytest.raises(ConfigError, match=r"expand.keep_per_hop=\[60, 140\] needs one entry per hop \(expand.hops=3\)"):
        check_config(config("expand.hops=3"))
    with pytest.raises(
        ConfigError,
        match=r"^expand.hops must be >= 1 here, got 0; hops=0 \(auto\) is derived only by "
        r"pipelines/preprocess.py",
    ):
        _check_config(config("expand.hops=0").expand)
