"""Property-based fuzzing of the triples importer: random small TSV files either import with every id kept
exactly as written, or fail with the project's DataError; any other exception is a bug."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from seeder.data.importers.triples import import_triples  # noqa: E402
from seeder.data.store import open_dataset  # noqa: E402
from seeder.system.io import DataError  # noqa: E402

# Leading zeros, number/date/boolean look-alikes, non-ASCII letters, an emoji, inner spaces; no tab,
# newline or '|' (the TSV and answer separators), so every field survives the file format.
ALPHABET = "0123456789aZ-._:/é名🙂 "
LOOKALIKES = ["007", "7", "01", "1", "1.0", "1e3", "true", "NaN", "null", "2020-01-01"]
ids = st.one_of(st.text(ALPHABET, min_size=1, max_size=6), st.sampled_from(LOOKALIKES))
rows = st.lists(st.lists(ids, min_size=3, max_size=3), min_size=0, max_size=8)
# At most one damaged row, so that about half the files are well-formed and import.
damage = st.one_of(
    st.none(), st.tuples(st.integers(0, 7), st.sampled_from(["empty", "blank", "short", "long"]), st.integers(0, 2))
)


def damaged(table: list[list[str]], how) -> list[list[str]]:
    if how is None or not table:
        return table
    at, kind, field = how
    table = [list(r) for r in table]
    r = table[at % len(table)]
    if kind in ("empty", "blank"):
        r[field] = "" if kind == "empty" else "  "
    elif kind == "short":
        del r[field]
    else:
        r.append("extra")
    return table


def expected(table: list[list[str]]) -> set[tuple[str, str, str]] | None:
    """The triples an import must store, or None where it must fail with DataError."""
    table = [r for r in table if r != [""]]  # a blank line is skipped
    if not table or any(len(r) != 3 for r in table):
        return None
    triples = {tuple(f.strip() for f in r) for r in table}
    if any("" in t for t in triples):
        return None
    return triples


# FUZZ_EXAMPLES=1000 for a longer search; 50 keeps the suite fast.
@settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", 50)), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(table=rows, how=damage, header=st.booleans(), bom=st.booleans(), answer_row=st.integers(0, 7))
def test_random_tsv_imports_exactly_or_fails_with_data_error(table, how, header, bom, answer_row):
    table = damaged(table, how)
    want = expected(table)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        text = ("head\trelation\ttail\n" if header else "") + "".join("\t".join(r) + "\n" for r in table)
        (tmp / "t.tsv").write_text(("\ufeff" if bom else "") + text, encoding="utf-8")
        queries = None
        if want:
            answer = sorted(want)[answer_row % len(want)][2]
            queries = tmp / "q.tsv"
            queries.write_text(f"text\tanswers\nwhere does it lead\t{answer}\n", encoding="utf-8")
        try:
            import_triples(tmp / "t.tsv", tmp / "ds", queries_path=queries, no_header=not header)
        except DataError as exc:
            event("refused with DataError")
            assert want is None, f"valid input refused: {exc}"
            assert str(tmp / "t.tsv") in str(exc) or (queries is not None and str(queries) in str(exc))
            assert not (tmp / "ds").exists()
            return
        event("imported")
        assert want is not None, "invalid input imported"
        kg = open_dataset(tmp / "ds")
        names = kg.nodes.column("name").to_pylist()
        rels = kg.relations.column("name").to_pylist()
        e = kg.table("edges").to_pydict()
        assert {(names[s], rels[r], names[d]) for s, d, r in zip(e["src"], e["dst"], e["relation"])} == want
        assert kg.num_edges == len(want)  # duplicates dropped
        assert sorted(names) == sorted({t[0] for t in want} | {t[2] for t in want})  # one node per distinct id
        assert [names[a] for a in kg.queries.column("answers").to_pylist()[0]] == [answer]
