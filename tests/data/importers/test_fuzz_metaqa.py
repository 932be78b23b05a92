"""Property-based fuzzing of the MetaQA importer: random small ``kb.txt`` files (damaged lines, blank lines,
BOMs, CRLF endings, stray bytes) and question files (with and without the bracketed topic, unknown answers,
qtype files that do not align) either import exactly what they say, or fail with the project's DataError
on one line naming the file; any other exception is a bug."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from seeder.data.importers.metaqa import import_metaqa  # noqa: E402
from seeder.data.store import open_dataset  # noqa: E402
from seeder.system.io import DataError  # noqa: E402

# No '|', tab, newline or bracket inside a name (the file format's separators); look-alikes and non-ASCII.
ALPHABET = "0123456789aZ-._:/é名🙂 '"
names = st.one_of(st.text(ALPHABET, min_size=1, max_size=5), st.sampled_from(["007", "7", "1999", "NaN", "null", "Kismet"]))
relations = st.sampled_from(["directed_by", "written_by", "release_year", "has_tags", "some_new_relation", "x"])
triples = st.lists(st.tuples(names, relations, names), min_size=0, max_size=6)
kb_damage = st.sampled_from(
    [None, None, None, "two_fields", "four_fields", "empty_field", "blank_line", "spaces_line", "latin1", "crlf"]
)
question = st.tuples(
    st.integers(0, 5),
    st.booleans(),
    st.lists(st.integers(0, 7), min_size=1, max_size=3),
    st.sampled_from(["what films did [{}] write", "[{}] is in which genre", "who directed {}"]),
)
q_damage = st.sampled_from([None, None, None, "no_tab", "blank_line", "empty_topic", "qtype_short", "qtype_ok", "latin1"])


def kb_text(rows, how) -> tuple[bytes, bool]:
    """(bytes of kb.txt, whether it must be refused)."""
    lines = ["|".join(r) for r in rows]
    bad = False
    if how == "two_fields" and lines:
        lines[0], bad = "a|b", True
    elif how == "four_fields" and lines:
        lines[-1], bad = lines[-1] + "|extra", True
    elif how == "empty_field" and lines:
        h, r, t = rows[0]
        lines[0], bad = f"{h}| |{t}", True
    elif how == "blank_line":
        lines.insert(len(lines) // 2, "")
    elif how == "spaces_line":
        lines.insert(0, "   \r")
    if any(not f.strip() for r in rows for f in r):
        bad = True  # a name of spaces only
    text = ("\r\n" if how == "crlf" else "\n").join(lines) + ("\n" if lines else "")
    data = text.encode()
    if how == "latin1":
        data, bad = data + b"caf\xe9|directed_by|x\n", True
    return data, bad


@settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", 40)),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(
    rows=triples,
    kb_how=kb_damage,
    questions=st.lists(question, min_size=1, max_size=4),
    q_how=q_damage,
    bom=st.booleans(),
    test_file=st.booleans(),
)
def test_random_metaqa_folders_import_exactly_or_fail_with_data_error(rows, kb_how, questions, q_how, bom, test_file):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "metaqa"
        (root / "1-hop").mkdir(parents=True)
        kb, kb_bad = kb_text(rows, kb_how)
        (root / "kb.txt").write_bytes(("\ufeff".encode() if bom else b"") + kb)
        entities = sorted({r[0].strip() for r in rows} | {r[2].strip() for r in rows})
        pool = entities + ["not in the graph"]
        lines, want_answers, q_bad = [], [], False
        for topic_i, _, answer_is, template in questions:
            topic = pool[topic_i % len(pool)]
            answers = [pool[a % len(pool)] for a in answer_is]
            lines.append(template.format(topic) + "\t" + "|".join(answers))
            if "[" not in template:
                q_bad = True  # MetaQA marks the topic entity with brackets
            found = {a.strip() for a in answers} & set(entities)
            if found:
                want_answers.append(found)
        if q_how == "no_tab":
            lines[0], q_bad = lines[0].replace("\t", " "), True
        elif q_how == "blank_line":
            lines += ["", "who is [x]\tx"]
            q_bad = True
        elif q_how == "empty_topic":
            lines[0], q_bad = "what is [ ]\t" + lines[0].split("\t", 1)[1], True
        data = ("\n".join(lines) + "\n").encode()
        if q_how == "latin1":
            data, q_bad = data + b"caf\xe9 [x]\tx\n", True
        (root / "1-hop" / "qa_dev.txt").write_bytes(("\ufeff".encode() if bom else b"") + data)
        if q_how in ("qtype_short", "qtype_ok"):
            count = len(lines) - (1 if q_how == "qtype_short" else 0)
            (root / "1-hop" / "qa_dev_qtype.txt").write_text("".join("movie_to_director\n" for _ in range(count)))
            q_bad |= q_how == "qtype_short"
        if test_file:
            (root / "1-hop" / "qa_test.txt").write_bytes(data)
        must_fail = kb_bad or q_bad or not rows
        out = Path(tmp) / "ds"
        try:
            import_metaqa(root, out)
        except DataError as exc:
            event("refused with DataError")
            message = str(exc)
            assert must_fail, f"valid input refused: {message}"
            assert "\n" not in message and str(root) in message, f"not one line naming the file: {message!r}"
            assert not out.exists()
            return
        event("imported")
        assert not must_fail, f"invalid input imported (kb {kb_how}, questions {q_how})"
        kg = open_dataset(out)
        names_ = kg.nodes.column("name").to_pylist()
        rels = kg.relations.column("name").to_pylist()
        e = kg.table("edges").to_pydict()
        stored = {(names_[s], rels[r], names_[d]) for s, d, r in zip(e["src"], e["dst"], e["relation"])}
        assert stored == {(h.strip(), r, t.strip()) for h, r, t in rows}
        assert not any(n.startswith("\ufeff") for n in names_)
        got = [{names_[a] for a in answers} for answers in kg.queries.column("answers").to_pylist()]
        copies = 2 if test_file else 1
        assert sorted(map(sorted, got)) == sorted(map(sorted, want_answers * copies))
