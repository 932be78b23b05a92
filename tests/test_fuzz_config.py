"""Property-based fuzzing of config loading: random ``section.field=value`` overrides and random YAML files
(NaN and infinities, huge integers, wrong types, unknown keys, invalid YAML, bytes that are not UTF-8).

Every outcome is either a config whose values are what was written (finite numbers, ints within int64)
or the project's ConfigError on one line that names the key or the file; any other exception is a bug.
FUZZ_EXAMPLES raises the example counts (default 40, to keep the quick suite fast).
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
import yaml  # noqa: E402
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from seeder.config import INT_LIMIT, ConfigError, SeederConfig, flatten, load_config  # noqa: E402

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", 40))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

KEYS = sorted(flatten(SeederConfig()))
SECTIONS = sorted({k.split(".")[0] for k in KEYS})
# Keys as a user might mistype them: known ones, unknown ones, empty parts, one level too deep or too shallow.
keys = st.one_of(
    st.sampled_from(KEYS),
    st.sampled_from(KEYS).map(lambda k: k + "x"),
    st.sampled_from(KEYS).map(lambda k: k + ".deeper"),
    st.sampled_from(SECTIONS),
    st.sampled_from(
        [
            "",
            ".",
            "train.",
            ".lr",
            "train..lr",
            " train.lr ",
            "train.lr\n",
            "tr\tain.lr",
            "baselines.ego_hops",
            "baselines.ego",
            "baselines.1",
            "1.2",
            "é.ü",
        ]
    ),
    st.text("abcdefghilnoprstu._ 1\n", min_size=0, max_size=12),
)
TRICKY = [
    "nan",
    ".nan",
    "NaN",
    "inf",
    ".inf",
    "-.inf",
    "-inf",
    "Infinity",
    "1e400",
    "-1e400",
    "1e-400",
    "9" * 30,
    "-" + "9" * 30,
    str(2**63),
    str(2**63 - 1),
    str(-(2**63)),
    "0x10",
    "0o17",
    "1_000",
    "1e3",
    "1.5",
    "-0",
    "true",
    "no",
    "null",
    "~",
    "",
    "[",
    "[1",
    "]",
    "{a",
    "{}",
    "[]",
    "[1, .nan]",
    "[1e30]",
    "[5,5]",
    "[[1]]",
    "'quoted",
    '"unterminated',
    "&a",
    "*a",
    "&a [*a]",
    "!!python/object:os.system",
    "!!binary aGVsbG8=",
    "!!float nan",
    "2020-01-01",
    "a: b",
    "- 1",
    "\x00",
    "\ufeff1",
    "é",
    "🙂",
    "a\nb",
    "\t1",
    "dense",
    "hash",
    "learned",
    "[60,140]",
    "[1/3]",
]
values = st.one_of(
    st.sampled_from(TRICKY), st.text(min_size=0, max_size=10), st.integers(-(2**70), 2**70).map(str), st.floats().map(repr)
)


def _check_error(exc: ConfigError, *names: str) -> None:
    message = str(exc)
    assert "\n" not in message and message.strip(), f"not a one-line message: {message!r}"
    assert any(name and name in message for name in names) or "unknown key" in message, (
        f"the message names neither {names} nor an unknown key: {message}"
    )


def _check_values(config: SeederConfig) -> None:
    """No silent wrong result: every number that got through is finite and fits an int64."""
    for key, value in flatten(config).items():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, float):
                assert math.isfinite(item), f"{key}={item!r} accepted"
            if isinstance(item, int) and not isinstance(item, bool):
                assert abs(item) <= INT_LIMIT, f"{key}={item!r} accepted"


@SETTINGS
@given(items=st.lists(st.tuples(keys, values), min_size=1, max_size=3), raw=st.booleans())
def test_random_overrides_load_exactly_or_fail_with_a_config_error(items, raw):
    overrides = [(k if raw else k.strip()) + "=" + v for k, v in items]
    try:
        config = load_config(None, overrides)
    except ConfigError as exc:
        event("refused")
        _check_error(exc, *(k.strip().split(".")[0] for k, _ in items), "override")
        return
    event("loaded")
    _check_values(config)
    # The last override of a known key is the value the config holds (coerced int -> float only).
    flat = flatten(config)
    key, value = items[-1]
    key = key.strip()
    if key in flat and not any(k.strip().startswith(key + ".") for k, _ in items):
        written = yaml.safe_load(value)
        held = flat[key]
        if isinstance(held, float) and isinstance(written, (int, float)) and not isinstance(written, bool):
            assert held == float(written)
        elif isinstance(held, float) and isinstance(written, str):
            assert held == float(written)
        else:
            assert held == written, f"{key}={value!r} loaded as {held!r}"


# Random YAML documents: known and unknown sections and keys, any scalar YAML can hold.
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=8), st.sampled_from(TRICKY)
)
documents = st.dictionaries(
    st.one_of(st.sampled_from(SECTIONS), st.text("abz_", max_size=4), st.integers(0, 3)),
    st.one_of(
        scalars,
        st.dictionaries(
            st.one_of(st.sampled_from([k.split(".", 1)[1] for k in KEYS]), st.text("abz", max_size=3)),
            st.one_of(scalars, st.lists(scalars, max_size=3)),
            max_size=4,
        ),
    ),
    max_size=4,
)
damage = st.sampled_from([None, None, "truncate", "latin1", "nul", "tab", "bom", "garbage", "deep", "list"])


def _damaged(text: str, how: str | None, cut: int) -> bytes:
    data = text.encode("utf-8")
    if how == "truncate":
        return data[: cut % (len(data) + 1)]
    if how == "latin1":
        return data[: cut % (len(data) + 1)] + b"\xe9\xff" + data[cut % (len(data) + 1) :]
    if how == "nul":
        return data + b"x: \x00\n"
    if how == "tab":
        return b"train:\n\tlr: 1\n" + data
    if how == "bom":
        return "\ufeff".encode() + data
    if how == "garbage":
        return data + b"\n}{][: - :\n"
    if how == "deep":
        return b"[" * 3000 + b"]" * 3000
    if how == "list":
        return b"- " + data
    return data


@SETTINGS
@given(document=documents, how=damage, cut=st.integers(0, 200))
def test_random_yaml_files_load_or_fail_with_a_config_error_naming_the_file(document, how, cut):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_bytes(_damaged(yaml.safe_dump(document, allow_unicode=True), how, cut))
        try:
            config = load_config(path)
        except ConfigError as exc:
            event(f"refused ({how})")
            message = str(exc)
            assert "\n" not in message and str(path) in message, f"message does not name the file on one line: {message!r}"
            return
        event(f"loaded ({how})")
        _check_values(config)


def test_invalid_yaml_is_one_line_naming_the_file_line_and_column(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  lr: [1, 2\n  epochs: 3\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message and "line 3, column" in message, message


def test_non_utf8_config_names_the_file_and_line(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"train:\n  init_from: caf\xe9\n")
    with pytest.raises(ConfigError, match=rf"{path}: line 2 is not valid UTF-8"):
        load_config(path)


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.lr=.nan", "train.lr=nan: not a finite number"),
        ("train.lr=1e400", "train.lr=inf: not a finite number"),
        ("train.epochs=" + "9" * 25, "train.epochs=" + "9" * 25 + ": out of range"),
        ("train.expansion_sizes=[5", "override train.expansion_sizes: value '[5' is not valid YAML"),
        ("train..lr=1", "a dotted key needs a name between every dot"),
    ],
)
def test_bad_overrides_are_config_errors(override, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace(".", r"\.")):
        load_config(None, [override])
