"""Property-based fuzzing of the STaRK importer: random small ``processed/`` folders (edges out of range, unknown
edge types, odd node_info, damaged tensor and pickle files) and query files (answer literals of every kind,
duplicate ids, split files that miss, repeat or invent ids) either import exactly what they say, or fail
with the project's DataError on one line naming the file; any other exception is a bug."""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
torch = pytest.importorskip("torch")
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from seeder.data.importers.stark import import_stark  # noqa: E402
from seeder.data.store import open_dataset  # noqa: E402
from seeder.system.io import DataError  # noqa: E402
from tests.data.importers.conftest import make_stark_kb  # noqa: E402

field_values = st.one_of(
    st.none(),
    st.text("ab é,", max_size=6),
    st.integers(-5, 5),
    st.just(float("nan")),
    st.lists(st.text("xy", max_size=3), max_size=3),
    st.dictionaries(st.text("k", max_size=2), st.integers(0, 3), max_size=2),
)
infos = st.dictionaries(
    st.sampled_from(["name", "title", "display_name", "details", "year", "source_id"]), field_values, max_size=3
)
answer_literals = st.one_of(
    st.lists(st.integers(-1, 7), min_size=0, max_size=3).map(str),
    st.sampled_from(["[]", "['a']", "[1, True]", "(1,)", "[1.5]", "garbage", "[", "None", "{1: 2}", "__import__('os')", ""]),
)
DAMAGE = [
    None,
    None,
    None,
    "truncate_edges",
    "garbage_info",
    "random_pickle",
    "float_edges",
    "flat_edges",
    "info_not_dict",
    "info_value_not_dict",
    "missing_types",
    "types_2d",
]


def damage_kb(kb: Path, how: str | None, n: int, noise: bytes) -> None:
    if how == "random_pickle":
        (kb / "edge_type_dict.pkl").write_bytes(b"\x80\x04" + noise)
    elif how == "truncate_edges":
        data = (kb / "edge_index.pt").read_bytes()
        (kb / "edge_index.pt").write_bytes(data[: len(data) // 2])
    elif how == "garbage_info":
        (kb / "node_info.pkl").write_bytes(b"\x80\x04garbage that is not a pickle")
    elif how == "float_edges":
        torch.save(torch.zeros(2, 1), kb / "edge_index.pt")
    elif how == "flat_edges":
        torch.save(torch.zeros(4, dtype=torch.long), kb / "edge_index.pt")
    elif how == "info_not_dict":
        (kb / "node_info.pkl").write_bytes(pickle.dumps([{"name": "x"}] * n))
    elif how == "info_value_not_dict":
        (kb / "node_info.pkl").write_bytes(pickle.dumps({0: "just a string"}))
    elif how == "missing_types":
        (kb / "node_types.pt").unlink()
    elif how == "types_2d":
        torch.save(torch.zeros(n, 2, dtype=torch.long), kb / "node_types.pt")


@settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", 30)), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 6),
    edges=st.lists(st.tuples(st.integers(-1, 7), st.integers(-1, 7), st.integers(-1, 2)), min_size=0, max_size=6),
    info=st.dictionaries(st.integers(-1, 7), infos, max_size=4),
    how=st.sampled_from(DAMAGE),
    queries=st.lists(st.tuples(st.integers(0, 6), answer_literals), min_size=1, max_size=4),
    split_of=st.lists(st.sampled_from(["train", "val", "test", None, "both"]), min_size=4, max_size=4),
    extra_split_line=st.sampled_from([None, None, "99", "x", "  "]),
    noise=st.binary(min_size=1, max_size=24),
)
def test_random_stark_folders_import_exactly_or_fail_with_data_error(
    n, edges, info, how, queries, split_of, extra_split_line, noise
):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        edge_index = torch.tensor([[s for s, _, _ in edges], [d for _, d, _ in edges]], dtype=torch.long).reshape(2, -1)
        edge_types = torch.tensor([t for _, _, t in edges], dtype=torch.long)
        kb = make_stark_kb(tmp / "kb", n, edges=(edge_index, edge_types), node_info=info)
        damage_kb(kb, how, n, noise)
        qa = tmp / "qa"
        (qa / "stark_qa").mkdir(parents=True)
        (qa / "split").mkdir()
        rows = ["id,query,answer_ids"] + [f'{i},"question {i}, please","{a}"' for i, a in queries]
        (qa / "stark_qa" / "stark_qa.csv").write_text("\n".join(rows) + "\n")
        ids = [i for i, _ in queries]
        splits = {"train": [], "val": [], "test": []}
        for k, i in enumerate(ids):
            where = split_of[k % len(split_of)]
            if where == "both":
                splits["train"].append(i)
                splits["val"].append(i)
            elif where is not None:
                splits[where].append(i)
        for name, members in splits.items():
            lines = [str(i) for i in members] + ([extra_split_line] if extra_split_line and name == "test" else [])
            (qa / "split" / f"{name}.index").write_text("\n".join(lines))

        # What must be refused.
        import ast

        def answers_ok(literal):
            try:
                value = ast.literal_eval(literal)
            except (ValueError, SyntaxError):
                return None
            if not isinstance(value, (list, tuple)) or not value:
                return None
            if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < n for v in value):
                return None
            return list(dict.fromkeys(value))

        parsed = [answers_ok(a) for _, a in queries]
        where_of = {}
        bad_split = extra_split_line in ("99", "x")
        for name, members in splits.items():
            for i in members:
                if i in where_of:
                    bad_split = True
                where_of[i] = name
        must_fail = (
            how is not None
            or any(not (0 <= s < n and 0 <= d < n) for s, d, _ in edges)
            or any(t not in (0, 1) for _, _, t in edges)
            or any(not 0 <= k < n for k in info)
            or any(p is None for p in parsed)
            or len(set(ids)) != len(ids)
            or bad_split
            or any(i not in where_of for i in ids)
        )
        out = tmp / "ds"
        try:
            import_stark(kb, qa, out)
        except DataError as exc:
            event(f"refused ({how})")
            message = str(exc)
            assert must_fail, f"valid input refused: {message}"
            assert "\n" not in message and (str(kb) in message or str(qa) in message), (
                f"not one line naming the file: {message!r}"
            )
            assert not out.exists()
            return
        event("imported")
        assert not must_fail, f"invalid input imported (damage {how}, edges {edges}, answers {queries})"
        kg = open_dataset(out)
        e = kg.table("edges").to_pydict()
        assert list(zip(e["src"], e["dst"], e["relation"])) == [(s, d, t) for s, d, t in edges]
        q = kg.queries.to_pydict()
        assert {i: (a, s) for i, a, s in zip(q["id"], q["answers"], q["split"])} == {
            i: (p, where_of[i]) for (i, _), p in zip(queries, parsed)
        }
