"""seeder/retrieve/learned.py: the trained retriever and its inference-time expansion schedule."""

from types import SimpleNamespace

import pytest

from seeder.config import ConfigError, load_config
from seeder.retrieve.learned import load_retriever
from seeder.train import build_state, save_checkpoint, steps_per_epoch, toy_task, train_epoch

TRAINED_WITH = ["train.expansion_sizes=[3,3]", "train.frontier_caps=[8,10]", "model.hidden_dim=16", "model.num_layers=2"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    data = toy_task(32, 30, 8, seed=0)
    config = load_config(None, [*TRAINED_WITH, "train.epochs=1", "train.warmup_epochs=0"])
    state = build_state(config, data.feature_dim, steps_per_epoch(data, config))
    train_epoch(state, data)
    path = tmp_path_factory.mktemp("model") / "best.pt"
    save_checkpoint(state, path)
    artifacts = SimpleNamespace(node_features=data.node_features, relation_features=data.relation_features, path="toy")
    return path, artifacts, data


def retrieve_with(checkpoint, overrides):
    path, artifacts, data = checkpoint
    retriever = load_retriever(artifacts, load_config(None, overrides), str(path))
    return retriever, retriever.retrieve(data.subgraphs, data.query_features)


def test_the_model_retrieves_with_its_training_schedule_by_default(checkpoint):
    retriever, result = retrieve_with(checkpoint, [])
    assert retriever.model_config.train.expansion_sizes == [3, 3]
    assert result.set_size.max() == 3 + 3 + 3  # three seeds, then c_t = 3 and 3


def test_eval_schedule_overrides_the_training_one(checkpoint):
    _, default = retrieve_with(checkpoint, [])
    retriever, larger = retrieve_with(checkpoint, ["eval.expansion_sizes=[3,6,4]", "eval.frontier_caps=[8,20,20]"])
    assert retriever.model_config.train.frontier_caps == [8, 20, 20]
    assert larger.set_size.max() == 3 + 3 + 6 + 4
    assert larger.set_size.mean() > default.set_size.mean()
    # No query gets a smaller set from a larger budget.
    assert (larger.set_size >= default.set_size).all()


def test_a_schedule_whose_caps_do_not_match_is_refused(checkpoint):
    with pytest.raises(ConfigError, match="eval.frontier_caps"):
        retrieve_with(checkpoint, ["eval.expansion_sizes=[3,6,4]"])
    with pytest.raises(ConfigError, match="positive"):
        retrieve_with(checkpoint, ["eval.expansion_sizes=[3,0]", "eval.frontier_caps=[8,8]"])
