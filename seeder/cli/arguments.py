"""Argument parsing shared by the commands and the Ray entry points: the help format and the options several commands take."""

from __future__ import annotations

import argparse
import re

_RST = re.compile(r"``(.+?)``|\*\*(.+?)\*\*")


def plain(text: str) -> str:
    """Docstrings double as --help text: show their RST literals and bold as plain words."""
    return _RST.sub(lambda m: m.group(1) or m.group(2), text)


def _no_default(value) -> bool:
    # Identity, not ==: a default of 0 or 0.0 is worth showing, an unset one (None) or a flag's False is not.
    return value is None or value is False or value is argparse.SUPPRESS


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every command's help: descriptions keep their line breaks and lose RST markup, and each option
    shows its default unless its help already says it or there is none (None, a False flag)."""

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain(text))

    def _get_help_string(self, action: argparse.Action) -> str:
        text = plain(action.help or "")
        if _no_default(action.default) or "default" in text.lower() or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser with ``HelpFormatter``, also for the subcommands that modules register."""

    def __init__(self, *args, **kwargs):
        kwargs["formatter_class"] = HelpFormatter
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs):
        # argparse prints nothing, default included, for an option without help.
        if kwargs.get("help") is None and not _no_default(kwargs.get("default")) and str(args[0]).startswith("-"):
            kwargs["help"] = "(default: %(default)s)"
        return super().add_argument(*args, **kwargs)


def positive_int(text: str) -> int:
    """argparse type of counts and sizes: an integer >= 1, refused while parsing (before any work)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_encoder_precision_argument(parser, defaults_shown: bool = False) -> None:
    """``--encoder-precision``, shared by ``seeder retrieve`` and ``seeder serve`` (whose help formatter
    shows defaults itself: ``defaults_shown``)."""
    # Imported here: the Ray entry points take this module for the help format alone, and the
    # retriever's imports would cost every preprocessing run (an update's included) a third of a second.
    from seeder.serving.retriever import ENCODER_PRECISIONS

    parser.add_argument(
        "--encoder-precision",
        choices=ENCODER_PRECISIONS,
        default="artifacts",
        help="number format of new questions' encoding on CPU: artifacts (as preprocessing encoded the dataset: "
        "preprocessed questions rank as in seeder evaluate), auto (bfloat16 where the CPU computes it natively: "
        "2x faster MiniLM, the same top node for 99.3%% of MetaQA val questions), float32, bfloat16, or int8 "
        "(int8 GEMMs: 1.3-1.7x bfloat16 for one question, the same top node for 96%%, Hit@1 unchanged)"
        + ("" if defaults_shown else " (default artifacts)"),
    )


def add_compile_argument(parser) -> None:
    """``--compile``, shared by ``seeder retrieve``, ``seeder serve`` and the serving benchmark."""
    parser.add_argument(
        "--compile",
        action="store_true",
        help="run the policy and the question encoder through torch.compile (seeder.serving.compiled): faster "
        "answers after 20-30 s of compiling on the first questions; needs a C++ compiler",
    )


def add_accept_mismatch_argument(parser) -> None:
    parser.add_argument(
        "--accept-mismatch",
        action="store_true",
        help="use artifacts whose dataset, or a model whose artifacts, have another fingerprint (a warning instead of an error)",
    )


def add_method_argument(parser: argparse.ArgumentParser, default: list[str]) -> None:
    """``--method`` (also spelled ``--methods``): repeated, a comma list, or ``all``; evaluate and benchmark."""
    parser.add_argument(
        "--method",
        "--methods",
        dest="methods",
        action="append",
        metavar="NAME",
        help="retrieval method; repeat it or give a comma list (dense,khop); 'all' is every registered method, "
        f"with seeder only when --model is given (default: {','.join(default)})",
    )


def add_split_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--split", default="val", choices=["train", "val", "test"], help="query split")


def parse_bool(text: str) -> bool:
    """An argparse type for a boolean option's value: true / false (also 1 / 0, yes / no)."""
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean; use true or false")
