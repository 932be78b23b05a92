"""`seeder evaluate` with a model on a newer version of its graph: the comparison with the version it
was trained on (``seeder.evaluation.versions``)."""

from __future__ import annotations

import json

import pytest

from seeder.cli.main import main
from seeder.evaluation.versions import RETRAIN_DROP, noise
from tests.datasets import hand_built_artifacts, preprocess_by_hand


@pytest.fixture
def versions(tmp_path):
    """A model (untrained) on version 1 of a 60-node graph, and version 2: three edges added, one node
    removed and two validation questions replaced, preprocessed in the same feature space."""
    from seeder.data.update import update_dataset
    from seeder.policy.checkpoint import load_model

    v1, model, questions = hand_built_artifacts(tmp_path / "v1", "dense", reduce_dim=0)
    changes = tmp_path / "changes.tsv"
    changes.write_text(
        "head\trelation\ttail\top\n"
        "entity alpha\trelation a\tentity omega\tadd\n"
        "entity beta\trelation b\tentity psi\tadd\n"
        "entity gamma\trelation c\tplace 7\tadd\n"
    )
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("id,text,type,op\nplace 5,,,remove\n")
    queries = tmp_path / "queries.csv"
    queries.write_text(
        "id,text,answers,split,op\n"
        f"104,{questions[4]},,,remove\n"
        f"105,{questions[5]},,,remove\n"
        f",{questions[4]},entity omega|place 7,val,add\n"
        f",{questions[5]},entity alpha,val,add\n"
    )
    update_dataset(
        tmp_path / "v1" / "dataset", tmp_path / "v2" / "dataset", triples_path=changes, nodes_path=nodes, queries_path=queries
    )
    v2 = preprocess_by_hand(tmp_path / "v2" / "dataset", tmp_path / "v2" / "artifacts", load_model(model)[1].config)
    return v1, v2, model


def evaluate(artifacts, model, json_path, *extra) -> int:
    return main(
        ["evaluate", "--artifacts", str(artifacts), "--method", "seeder", "--model", str(model), "--split", "val"]
        + ["--json", str(json_path), *extra]
    )


def test_evaluate_on_an_updated_version_compares_with_the_trained_version(versions, tmp_path, capsys):
    v1, v2, model = versions
    assert evaluate(v1, model, tmp_path / "v1.json") == 0
    alone = capsys.readouterr().out
    assert "trained version" not in alone  # the version it was trained on: nothing to compare with
    before = json.loads((tmp_path / "v1.json").read_text())
    assert "comparison" not in before

    assert evaluate(v2, model, tmp_path / "v2.json") == 0
    out = capsys.readouterr().out
    after = json.loads((tmp_path / "v2.json").read_text())
    old, new = before["methods"]["seeder"]["all"], after["methods"]["seeder"]["all"]
    comparison = after["comparison"]
    assert after["baseline"]["artifacts"] == str(v1.resolve())
    assert after["baseline"]["metrics"] == old  # the same numbers as evaluating version 1 on its own
    for key in ("hit_at_1", "recall_at_20", "mrr"):
        row = comparison["metrics"][key]
        assert (row["before"], row["after"]) == (old[key], new[key])
        assert row["change"] == pytest.approx(new[key] - old[key])
    ceiling = comparison["metrics"]["ceiling_recall_any"]
    assert (ceiling["before"], ceiling["after"]) == (
        before["ceiling"]["all"]["recall_any"],
        after["ceiling"]["all"]["recall_any"],
    )
    assert comparison["queries"] == {"before": before["queries"], "after": after["queries"]}
    margin = noise(old["hit_at_1"], before["queries"], new["hit_at_1"], after["queries"])
    assert comparison["noise"] == pytest.approx(margin)
    assert comparison["retrain"] == (old["hit_at_1"] - new["hit_at_1"] > max(RETRAIN_DROP, margin))

    line = out.strip().splitlines()[-1]
    change = new["hit_at_1"] - old["hit_at_1"]
    assert line.startswith(
        f"Hit@1 {old['hit_at_1']:.3f} -> {new['hit_at_1']:.3f} ({change:+.3f}, noise {margin:.3f}) on the updated version; "
    )
    assert f"retrain when Hit@1 falls by more than {RETRAIN_DROP:.2f}" in line
    assert line.endswith("retrain" if comparison["retrain"] else "no need to retrain yet")
    table = out[out.index("the same model on the version it was trained on") :]
    for label, key in (("Hit@1", "hit_at_1"), ("Recall@20", "recall_at_20"), ("MRR", "mrr")):
        row = comparison["metrics"][key]
        assert f"{label}  " in table and f"{row['before']:.4f}" in table and f"{row['change']:+.4f}" in table


def test_the_comparison_can_be_pointed_elsewhere_or_left_out(versions, tmp_path, capsys):
    import shutil

    v1, v2, model = versions
    assert evaluate(v2, model, tmp_path / "none.json", "--baseline-artifacts", "none") == 0
    assert "trained version" not in capsys.readouterr().out
    assert "comparison" not in json.loads((tmp_path / "none.json").read_text())

    moved = tmp_path / "moved-v1"
    shutil.move(v1, moved)  # the recorded location is gone: a note, and the evaluation still succeeds
    assert evaluate(v2, model, tmp_path / "gone.json") == 0
    captured = capsys.readouterr()
    assert "no comparison with the version the model was trained on" in captured.err and "--baseline-artifacts" in captured.err
    assert evaluate(v2, model, tmp_path / "moved.json", "--baseline-artifacts", str(moved)) == 0
    assert json.loads((tmp_path / "moved.json").read_text())["baseline"]["artifacts"] == str(moved)
    assert "on the updated version; retrain when" in capsys.readouterr().out


def test_the_rule_says_retrain_past_the_drop():
    from seeder.evaluation.versions import compare, format_comparison

    def report(hit, recall_any, queries):
        metrics = {"hit_at_1": hit, "hit_at_5": hit, "recall_at_20": 0.99, "mrr": hit}
        return {"methods": {"seeder": {"all": metrics}}, "ceiling": {"all": {"recall_any": recall_any}}, "queries": queries}

    baseline = {
        "artifacts": "v1",
        "metrics": report(0.95, 1.0, 600)["methods"]["seeder"]["all"],
        "ceiling": {"recall_any": 1.0},
        "queries": 600,
    }
    dropped = compare(report(0.91, 0.98, 590), baseline, [1, 5, 20])
    assert dropped["retrain"] and dropped["metrics"]["hit_at_1"]["change"] == pytest.approx(-0.04)
    assert dropped["metrics"]["ceiling_recall_any"]["change"] == pytest.approx(-0.02)
    text = format_comparison(dropped, baseline, "test")
    assert dropped["noise"] == pytest.approx(2 * (0.95 * 0.05 / 600 + 0.91 * 0.09 / 590) ** 0.5)  # 0.030
    assert "Hit@1 0.950 -> 0.910 (-0.040, noise 0.030) on the updated version; retrain when Hit@1 falls by more than" in text
    assert text.endswith(": retrain")
    assert not compare(report(0.95 - RETRAIN_DROP / 2, 1.0, 600), baseline, [1, 5, 20])["retrain"]
    assert not compare(report(0.91, 1.0, 20), baseline | {"queries": 20}, [1, 5, 20])["retrain"]  # 0.04 is noise on 20
    assert compare(report(0.5, 1.0, 600), baseline, [5, 20])["retrain"] is None  # the rule reads Hit@1
