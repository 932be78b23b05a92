"""Typed config: defaults, YAML files, dotted overrides, unknown keys, and a docstring for every field."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from seeder.config import (
    ConfigError,
    SeederConfig,
    describe,
    field_docs,
    flatten,
    load_config,
    parse_overrides,
)

REPO = Path(__file__).resolve().parents[1]


def all_sections():
    return [type(getattr(SeederConfig(), f.name)) for f in dataclasses.fields(SeederConfig)]


def test_defaults_without_file():
    cfg = load_config()
    assert cfg == SeederConfig()
    assert cfg.expand.keep_per_hop == [60, 140]


def test_yaml_then_overrides_take_precedence(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lr: 0.01\n  epochs: 4\nexpand:\n  budget: 120\n")
    cfg = load_config(path, ["train.lr=3e-4", "train.expansion_sizes=[5,5,5]", "model.query_injection=add"])
    assert cfg.train.lr == pytest.approx(3e-4)  # YAML 1.1 reads 3e-4 as a string: coerced to float
    assert cfg.train.epochs == 4
    assert cfg.expand.budget == 120
    assert cfg.train.expansion_sizes == [5, 5, 5]
    assert cfg.model.query_injection == "add"
    assert cfg.seed.k0 == SeederConfig().seed.k0  # untouched sections keep defaults


def test_int_accepted_for_float_but_not_the_reverse():
    assert load_config(None, ["train.lr=1"]).train.lr == 1.0
    with pytest.raises(ConfigError, match="train.epochs: expected int"):
        load_config(None, ["train.epochs=1.5"])
    with pytest.raises(ConfigError, match="expected int"):
        load_config(None, ["expand.budget=true"])  # bool is not an int here
    with pytest.raises(ConfigError, match="expected a list"):
        load_config(None, ["train.expansion_sizes=7"])


def test_unknown_keys_name_the_key_and_the_known_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key train\.lrr; known keys here: .*lr"):
        load_config(None, ["train.lrr=1"])
    path = tmp_path / "c.yaml"
    path.write_text("trian:\n  lr: 1\n")
    with pytest.raises(ConfigError, match=rf"unknown key trian.*in {path}"):
        load_config(path)


def test_bad_files_and_overrides():
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("/no/such/file.yaml")
    with pytest.raises(ConfigError, match="not KEY=VALUE"):
        parse_overrides(["train.lr"])
    with pytest.raises(ConfigError, match="not a section"):
        load_config(None, ["train.lr=1", "train.lr.x=2"])


def test_not_a_mapping_and_invalid_yaml(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(path)
    path.write_text("train: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)


@pytest.mark.parametrize("section", all_sections(), ids=lambda c: c.__name__)
def test_every_field_has_a_docstring(section):
    docs = field_docs(section)
    missing = [f.name for f in dataclasses.fields(section) if not docs.get(f.name)]
    assert not missing, f"{section.__name__} fields without a docstring: {missing}"


def test_top_level_sections_documented_and_describe_lists_every_leaf():
    assert set(field_docs(SeederConfig)) == {f.name for f in dataclasses.fields(SeederConfig)}
    lines = describe()
    leaves = flatten(SeederConfig())
    assert len(lines) == len(leaves)
    for key in leaves:
        assert any(line.startswith(f"{key} = ") for line in lines), key


def test_repo_configs_load():
    """Every pipeline config in configs/ (a YAML file naming at least one section) loads cleanly."""
    import yaml

    sections = {f.name for f in dataclasses.fields(SeederConfig)}
    for path in sorted((REPO / "configs").glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        if isinstance(data, dict) and sections & set(data):
            load_config(path)


def test_training_config_keeps_the_artifacts_preprocessing_sections(tmp_path):
    from seeder.config import PREPROCESSING_SECTIONS, training_config

    built_with = load_config(None, ["expand.budget=150", "seed.k0=2", "reduce.dim=64"])
    path = tmp_path / "run.yaml"
    path.write_text("expand:\n  budget: 300\ntrain:\n  lr: 0.0005\n")
    config = training_config(built_with, path, ["model.hidden_dim=48", "seed.k0=5"])
    for section in PREPROCESSING_SECTIONS:
        assert getattr(config, section) == getattr(built_with, section)
    assert (config.train.lr, config.model.hidden_dim) == (5e-4, 48)


def test_a_derived_step_budget_applies_unless_the_training_config_sets_one(tmp_path):
    from seeder.config import training_config

    built_with = load_config(None, ["expand.hops=3", "expand.keep_per_hop=[20,60,120]"])
    derived = {"expansion_sizes": [5, 9, 27], "frontier_caps": [25, 45, 135]}
    config = training_config(built_with, None, ["train.lr=0.002"], derived)
    assert (config.train.expansion_sizes, config.train.frontier_caps) == ([5, 9, 27], [25, 45, 135])
    assert training_config(built_with, None, [], None).train.expansion_sizes == SeederConfig().train.expansion_sizes
    given = training_config(built_with, None, ["train.expansion_sizes=[4,4]"], derived)
    assert (given.train.expansion_sizes, given.train.frontier_caps) == ([4, 4], SeederConfig().train.frontier_caps)
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  frontier_caps: [30, 60]\n")
    assert training_config(built_with, path, [], derived).train.expansion_sizes == SeederConfig().train.expansion_sizes


def test_every_choice_field_is_checked_when_its_section_is_built():
    from seeder.config import SeederConfig, _choice_fields

    def sections(instance, prefix):
        yield prefix, type(instance)
        for f in dataclasses.fields(instance):
            value = getattr(instance, f.name)
            if dataclasses.is_dataclass(value):
                yield from sections(value, f"{prefix}.{f.name}" if prefix else f.name)

    checked = 0
    for key, cls in sections(SeederConfig(), ""):
        for name, allowed in _choice_fields(cls).items():
            with pytest.raises(ConfigError, match=re.escape(f"{key}.{name}='bogus': use one of {', '.join(allowed)}")):
                load_config(None, [f"{key}.{name}=bogus"])
            with pytest.raises(ConfigError, match=re.escape(f"{key}.{name}=")):
                cls(**{name: "bogus"})
            checked += 1
    assert checked >= 8  # seed.strategy, expand.parent_term/relation_score, prior.model, model.query_injection, ...


def test_a_choice_spelled_like_a_yaml_boolean_keeps_its_spelling(tmp_path):
    # YAML 1.1 reads a bare `off` as False; the choice field gets "off" back, from a file or an override.
    assert load_config(None, ["prior.vote=off"]).prior.vote == "off"
    path = tmp_path / "c.yaml"
    path.write_text("prior:\n  vote: off\n")
    assert load_config(path, []).prior.vote == "off"
    with pytest.raises(ConfigError, match="prior.vote=True: use one of off, labelled, auto"):
        load_config(None, ["prior.vote=yes"])  # no choice is spelled like true


def test_configs_written_before_the_baselines_had_sub_sections_still_load():
    from seeder.config import SeederConfig, from_dict

    old = {"baselines": {"gretriever_topk_nodes": 7, "mmr_lambda": 0.5, "ego_max_nodes": 90, "rrf_k": 30, "seeds": 2}}
    b = from_dict(SeederConfig, old).baselines
    assert (b.gretriever.topk_nodes, b.mmr.relevance, b.ego.max_nodes, b.hybrid.rrf_k, b.seeds) == (7, 0.5, 90, 30, 2)
