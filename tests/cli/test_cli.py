"""The `seeder` command and the Ray entry points as a user meets them: --version, help texts without
RST markup and with every default shown, errors before any work."""

from __future__ import annotations

import argparse
import importlib.metadata
from pathlib import Path

import pytest

from seeder.cli.main import build_parser, main

REPO = Path(__file__).resolve().parents[2]


def _parsers(parser: argparse.ArgumentParser, name: str = "seeder"):
    """(command name, parser) for ``parser`` and every subcommand below it."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


def test_version_comes_from_the_package_metadata(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"seeder {importlib.metadata.version('seeder')}"


def test_every_seeder_help_is_plain_text_and_shows_each_default():
    commands = dict(_parsers(build_parser()))
    assert {"seeder evaluate", "seeder benchmark", "seeder retrieve", "seeder import triples", "seeder ui"} <= set(commands)
    for name, parser in commands.items():
        text = parser.format_help()
        assert "``" not in text and "**" not in text, name
        formatter = parser._get_formatter()
        for action in parser._actions:
            unset = action.default is None or action.default is False or action.default is argparse.SUPPRESS
            if action.option_strings and action.help is not argparse.SUPPRESS and not unset:
                assert "default" in formatter._expand_help(action), f"{name} {action.option_strings[0]}"


def test_evaluate_and_benchmark_spell_method_and_split_alike():
    commands = dict(_parsers(build_parser()))
    for name in ("seeder evaluate", "seeder benchmark"):
        options = {opt: action for action in commands[name]._actions for opt in action.option_strings}
        assert options["--method"] is options["--methods"] and options["--method"].dest == "methods", name
        assert options["--split"].default == "val", name


@pytest.mark.parametrize(
    "module, expected",
    [
        (
            "pipelines.preprocess",
            "--shard-rows SHARD_ROWS\n                        texts per embedding shard (resume granularity)\n"
            "                        (default: 10000)",
        ),
        ("pipelines.train", "(default: seeder-train)"),
        ("pipelines.benchmark", "--ray-address RAY_ADDRESS"),
        ("tune.sweep", "--ray-address RAY_ADDRESS"),
    ],
)
def test_entry_point_help_is_plain_text_with_the_shared_ray_options(module, expected, capsys):
    import importlib

    entry = importlib.import_module(module)
    with pytest.raises(SystemExit) as exit_info:
        (entry.parse_args if module == "pipelines.preprocess" else entry.main)(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "``" not in text and "**" not in text
    assert expected in text
    # The same words for the same option in every entry point.
    assert "Default: RAY_ADDRESS (ray job submit sets it), else an embedded local Ray" in " ".join(text.split())
    assert "CPUs of an embedded local Ray (default: all of this machine's)" in " ".join(text.split())


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-k", "0"], "argument -k: must be >= 1, got 0"),
        (["-k", "-5"], "argument -k: must be >= 1, got -5"),
        (["--batch-size", "0"], "argument --batch-size: must be >= 1, got 0"),
        (["-k", "ten"], "argument -k: 'ten' is not an integer"),
    ],
)
def test_retrieve_refuses_counts_below_one_while_parsing(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["retrieve", "a question", "--model", "no-such-model", *argv])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"seeder retrieve: error: {message}"


@pytest.mark.parametrize("question", ["", "   "])
def test_retrieve_refuses_an_empty_question_before_loading_anything(question, capsys):
    # The model path does not exist: the question is checked first, so this is the only error.
    assert main(["retrieve", question, "--model", "no-such-model"]) == 2
    assert capsys.readouterr().err.strip() == (
        "seeder retrieve: error: the question is empty; give a question with words in it, or --file FILE"
    )


def test_a_dataset_given_as_artifacts_says_what_to_run(tmp_path, capsys):
    from seeder.data.store import write_dataset
    from tests.data.test_store import tables

    dataset = write_dataset(tmp_path / "kg", *tables())
    assert main(["evaluate", "--artifacts", str(dataset), "--method", "dense"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"seeder evaluate: error: {dataset}: this is a dataset, not artifacts: run pipelines/preprocess.py "
        f"--dataset {dataset} --out ARTIFACTS and pass ARTIFACTS instead"
    )
    other = tmp_path / "other"
    other.mkdir()
    (other / "manifest.json").write_text('{"kind": "something"}')
    assert main(["evaluate", "--artifacts", str(other), "--method", "dense"]) == 2
    assert "its manifest.json has no dataset or config, so it is not an artifacts directory" in capsys.readouterr().err
