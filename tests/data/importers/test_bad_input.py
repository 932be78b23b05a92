"""Bad input: one test per case, each asserting that the message names the file, the row or id, and the fix."""

from __future__ import annotations

import re

import pytest

from seeder.data.importers.metaqa import import_metaqa
from seeder.data.importers.stark import import_stark, read_queries
from seeder.data.importers.triples import import_triples
from seeder.system.io import DataError
from tests.data.importers.conftest import make_stark_kb, make_stark_qa

TSV = "head\trelation\ttail\na\tr\tb\nb\tr\tc\n"


def tsv(tmp_path, text=TSV, name="t.tsv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_duplicate_node_ids_in_node_file(tmp_path):
    nodes = tsv(tmp_path, "id,text\na,first\nb,second\na,again\n", "n.csv")
    with pytest.raises(DataError, match=rf"{re.escape(str(nodes))}: 1 duplicate node ids, first a \(lines 4\)"):
        import_triples(tsv(tmp_path), tmp_path / "ds", nodes_path=nodes)


def test_edges_to_missing_nodes_stark(tmp_path):
    import torch

    kb = make_stark_kb(tmp_path / "kb", 3, edges=(torch.tensor([[0, 1], [1, 7]]), torch.tensor([0, 0])))
    qa = make_stark_qa(tmp_path / "qa", [(1, "q", "[1]")], {"train": [1]})
    with pytest.raises(DataError, match=r"edge_index.pt: 1 edges name nodes outside 0..2 .*first edges 1 with ends \(1, 7\)"):
        import_stark(kb, qa, tmp_path / "ds")
    assert not (tmp_path / "ds").exists()


def test_unknown_relation_type_stark(tmp_path):
    import torch

    kb = make_stark_kb(tmp_path / "kb", 3, edges=(torch.tensor([[0, 1], [1, 2]]), torch.tensor([0, 5])))
    qa = make_stark_qa(tmp_path / "qa", [(1, "q", "[1]")], {"train": [1]})
    with pytest.raises(
        DataError, match=r"edge_types.pt: 1 edges have types not in edge_type_dict.pkl, first edges 1 with types 5"
    ):
        import_stark(kb, qa, tmp_path / "ds")


def test_empty_node_text(tmp_path):
    nodes = tsv(tmp_path, 'id,text\na,first\nb,"  "\n', "n.csv")
    with pytest.raises(DataError, match=rf"{re.escape(str(nodes))}: 1 nodes with empty text, first lines 3"):
        import_triples(tsv(tmp_path), tmp_path / "ds", nodes_path=nodes)


def test_empty_query_text(tmp_path):
    queries = tsv(tmp_path, "text\tanswers\nfine\ta\n\tb\n", "q.tsv")
    with pytest.raises(DataError, match=rf"{re.escape(str(queries))}: 1 queries with empty text, first lines 3"):
        import_triples(tsv(tmp_path), tmp_path / "ds", queries_path=queries)


def test_empty_head_in_triples(tmp_path):
    path = tsv(tmp_path, "head\trelation\ttail\na\tr\tb\n\tr\tc\n")
    with pytest.raises(DataError, match=r"1 rows with an empty head, first lines 3"):
        import_triples(path, tmp_path / "ds")


def test_non_utf8_metaqa_kb_names_file_and_line(tmp_path):
    root = tmp_path / "mq"
    (root / "1-hop").mkdir(parents=True)
    (root / "kb.txt").write_bytes(b"A|directed_by|B\nC|directed_by|D\nCaf\xe9|directed_by|E\n")
    (root / "1-hop" / "qa_dev.txt").write_text("who directed [A]\tB\n")
    with pytest.raises(DataError, match=r"kb.txt: line 3 is not valid UTF-8.*re-encode"):
        import_metaqa(root, tmp_path / "ds")


def test_non_utf8_triples_names_line_across_read_chunks(tmp_path):
    from seeder.data.importers import check_utf8

    path = tmp_path / "t.tsv"
    path.write_bytes(b"head\trelation\ttail\n" + b"x\tr\ty\n" * 1000 + b"\xff\tr\ty\n")
    with pytest.raises(DataError, match=r"t.tsv: line 1002 is not valid UTF-8"):
        check_utf8(path, chunk_size=1000)  # the bad byte lies several chunks in
    with pytest.raises(DataError, match=r"t.tsv: line 1002 is not valid UTF-8"):
        import_triples(path, tmp_path / "ds")


def test_answers_not_in_graph_triples(tmp_path):
    queries = tsv(tmp_path, "text\tanswers\nq1\ta\nq2\tb|zed\n", "q.tsv")
    with pytest.raises(DataError, match=r"q.tsv: 1 answers are not nodes of the graph, first at lines 3 \('zed'\)"):
        import_triples(tsv(tmp_path), tmp_path / "ds", queries_path=queries)


def test_answers_not_in_graph_stark(tmp_path):
    kb = make_stark_kb(tmp_path / "kb", 4)
    qa = make_stark_qa(tmp_path / "qa", [(1, "q", "[1]"), (2, "r", "[3, 99]")], {"train": [1, 2]})
    with pytest.raises(DataError, match=r"stark_qa.csv: 1 answer ids are not nodes .* first at lines 3 \(answer ids 99\)"):
        import_stark(kb, qa, tmp_path / "ds")


def test_queries_without_answers(tmp_path):
    queries = tsv(tmp_path, "text\tanswers\nq1\ta\nq2\t\n", "q.tsv")
    with pytest.raises(DataError, match=r"q.tsv: 1 queries without answers, first lines 3"):
        import_triples(tsv(tmp_path), tmp_path / "ds", queries_path=queries)
    qa = make_stark_qa(tmp_path / "qa", [(1, "q", "[]")], {"train": [1]})
    with pytest.raises(DataError, match=r"line 2 \(query id 1\) has no answers"):
        read_queries(qa)


def test_answer_literal_is_parsed_safely(tmp_path):
    qa = make_stark_qa(tmp_path / "qa", [(1, "q", "[1]"), (2, "r", "__import__('os').system('true')")], {"train": [1, 2]})
    with pytest.raises(DataError, match=r"line 3 \(query id 2\): answer_ids .* is not a list of integer node ids"):
        read_queries(qa)


def test_missing_columns(tmp_path):
    path = tsv(tmp_path, "a\tb\tc\td\nx\ty\tz\tw\n")
    with pytest.raises(DataError, match=r"t.tsv: no columns head, relation, tail \(have: a, b, c, d\).*--head-col"):
        import_triples(path, tmp_path / "ds")
    nodes = tsv(tmp_path, "id,description\na,x\n", "n.csv")
    with pytest.raises(DataError, match=r"n.csv: needs columns id \(or name\) and text"):
        import_triples(tsv(tmp_path), tmp_path / "ds", nodes_path=nodes)
    queries = tsv(tmp_path, "question\tanswers\nq\ta\n", "q.tsv")
    with pytest.raises(DataError, match=r"q.tsv: missing column 'text'"):
        import_triples(tsv(tmp_path), tmp_path / "ds", queries_path=queries)


def test_mistyped_columns(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"head": [1.5], "relation": ["r"], "tail": ["b"]}), path)
    with pytest.raises(DataError, match=r"t.parquet: column 'head' has type double; expected strings or integer ids"):
        import_triples(path, tmp_path / "ds")
    queries = tsv(tmp_path, "text\tanswers\tid\nq\ta\tnot-a-number\n", "q.tsv")
    with pytest.raises(DataError, match=r"q.tsv: column 'id' must hold integer query ids"):
        import_triples(tsv(tmp_path), tmp_path / "ds", queries_path=queries)


def test_bad_split_values_and_split_files(tmp_path):
    queries = tsv(tmp_path, "text\tanswers\tsplit\nq\ta\ttrain\nr\tb\tdev\n", "q.tsv")
    with pytest.raises(DataError, match=r"q.tsv: 1 rows with split not in train/val/test, first lines 3 \('dev'\)"):
        import_triples(tsv(tmp_path), tmp_path / "ds", queries_path=queries)
    qa = make_stark_qa(tmp_path / "qa", [(1, "q", "[1]"), (2, "r", "[2]")], {"train": [1, 5]})
    with pytest.raises(DataError, match=r"train.index: 1 query ids are not in .*stark_qa.csv, first: 5"):
        read_queries(qa)
    qa = make_stark_qa(tmp_path / "qb", [(1, "q", "[1]"), (2, "r", "[2]")], {"train": [1]})
    with pytest.raises(DataError, match=r"1 queries are in no split/\*.index file, first ids 2"):
        read_queries(qa)


def test_malformed_metaqa_lines(tmp_path):
    root = tmp_path / "mq"
    (root / "1-hop").mkdir(parents=True)
    (root / "kb.txt").write_text("A|directed_by|B\nC|D\n")
    with pytest.raises(DataError, match=r"kb.txt: 1 lines are not head\|relation\|tail, first lines 2"):
        import_metaqa(root, tmp_path / "ds")
    (root / "kb.txt").write_text("A|directed_by|B\n")
    (root / "1-hop" / "qa_dev.txt").write_text("who directed [A]\tB\nno topic here\tB\n")
    with pytest.raises(DataError, match=r"qa_dev.txt: 1 questions without a \[topic entity\], first lines 2"):
        import_metaqa(root, tmp_path / "ds")


def test_import_failing_midway_leaves_no_complete_dataset(tmp_path, monkeypatch):
    import seeder.data.store as store
    from seeder.data.store import open_dataset

    def fail(*args, **kwargs):
        raise KeyboardInterrupt  # as if the import were interrupted while writing the CSR

    nodes, queries = tsv(tmp_path, "id,text\na,A\n", "n.csv"), tsv(tmp_path, "text\tanswers\nq\ta\n", "q.tsv")
    monkeypatch.setattr(store, "build_csr", fail)
    with pytest.raises(KeyboardInterrupt):
        import_triples(tsv(tmp_path), tmp_path / "out" / "ds", nodes_path=nodes, queries_path=queries)
    assert not (tmp_path / "out" / "ds").exists()
    assert list((tmp_path / "out").iterdir()) == []  # the partial directory is gone too
    with pytest.raises(DataError, match="no such dataset directory"):
        open_dataset(tmp_path / "out" / "ds")


def test_killed_writer_leaves_only_a_partial_directory(tmp_path):
    """SIGKILL while `seeder synth` is writing: no dataset directory appears, only a hidden *.partial-*."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from seeder.data.store import open_dataset

    out = tmp_path / "ds"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "seeder.cli",
            "synth",
            "--out",
            str(out),
            "--nodes",
            "1500000",
            "--relations",
            "6",
            "--hubs",
            "0",
            "--multi-answer-frac",
            "0",
            "--queries",
            "1000",
        ],
        stderr=subprocess.DEVNULL,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
    )
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".ds.partial-*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if proc.returncode != -signal.SIGKILL:
        pytest.skip("the writer finished before it could be killed")
    assert not out.exists()
    with pytest.raises(DataError, match="no such dataset directory"):
        open_dataset(out)


def test_import_overwrite_refuses_a_foreign_folder_and_a_busy_out(tmp_path, capsys):
    from seeder.cli.main import main
    from tests.processes import lock_held_by_another_process

    folder = tmp_path / "project"
    (folder / "src").mkdir(parents=True)
    (folder / "src" / "main.c").write_text("int main() {}")
    command = ["import", "triples", "--triples", str(tsv(tmp_path)), "--out", str(folder), "--overwrite"]
    assert main(command) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"seeder import: error: {folder}: not a directory this tool wrote (it has no manifest.json of kind "
        f"seeder-dataset or seeder-artifacts), so it is left untouched rather than replaced; remove it "
        f"yourself or choose another --out"
    )
    assert (folder / "src" / "main.c").read_text() == "int main() {}" and len(list(folder.rglob("*"))) == 2

    out = tmp_path / "ds"
    with lock_held_by_another_process(out) as first:
        assert main(["import", "triples", "--triples", str(tsv(tmp_path)), "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"seeder import: error: {out} is being written by process {first.pid}") and "\n" not in err
        assert not out.exists()
    assert main(["import", "triples", "--triples", str(tsv(tmp_path)), "--out", str(out)]) == 0


@pytest.mark.parametrize("option", ["triples", "nodes", "queries"])
def test_header_only_files_say_so(tmp_path, option):
    header = {"triples": "head\trelation\ttail\n", "nodes": "id,text\n", "queries": "text\tanswers\n"}[option]
    path = tsv(tmp_path, header, {"triples": "h.tsv", "nodes": "n.csv", "queries": "q.tsv"}[option])
    kwargs = {} if option == "triples" else {f"{option}_path": path}
    with pytest.raises(
        DataError,
        match=rf"^{re.escape(str(path))}: header only \(a header line and no rows\); "
        r"a file needs at least one row of data$",
    ):
        import_triples(path if option == "triples" else tsv(tmp_path), tmp_path / "ds", **kwargs)
    assert not (tmp_path / "ds").exists()


def test_empty_files_say_so(tmp_path):
    path = tsv(tmp_path, "")
    with pytest.raises(DataError, match=r"t.tsv: the file is empty; expected a header line and at least one row"):
        import_triples(path, tmp_path / "ds")
    with pytest.raises(DataError, match=r"t.tsv: the file is empty; expected at least one row$"):
        import_triples(path, tmp_path / "ds", no_header=True)


def test_rows_with_the_wrong_number_of_columns_name_file_line_and_row(tmp_path):
    path = tsv(tmp_path, "head\trelation\ttail\na\tr\tb\nb\tr\nc\tr\td\textra\n")
    with pytest.raises(
        DataError,
        match=r"t.tsv: 2 rows do not have 3 columns like the header, first line 3 "
        r"\(2 columns: 'b\\tr'\); every row needs one value per column, tab-separated",
    ):
        import_triples(path, tmp_path / "ds")
    csv = tsv(tmp_path, 'id,text\na,"A, quoted"\nb\n', "n.csv")
    with pytest.raises(
        DataError,
        match=r"n.csv: 1 rows do not have 2 columns like the header, first line 3 "
        r"\(1 columns: 'b'\); .* comma-separated",
    ):
        import_triples(tsv(tmp_path), tmp_path / "ds", nodes_path=csv)
    headerless = tsv(tmp_path, "a\tr\n", "h.tsv")
    with pytest.raises(DataError, match=r"h.tsv: 2 columns, expected 3 \(head, relation, tail\) in a file without a header"):
        import_triples(headerless, tmp_path / "ds", no_header=True)


def test_a_directory_given_as_a_file_says_so(tmp_path, capsys):
    from seeder.cli.main import main

    (tmp_path / "dir.tsv").mkdir()
    assert main(["import", "triples", "--triples", str(tmp_path / "dir.tsv"), "--out", str(tmp_path / "ds")]) == 2
    err = capsys.readouterr().err.strip().splitlines()  # progress lines, then the one-line error
    assert err[-1] == f"seeder import: error: {tmp_path / 'dir.tsv'}: is a directory, expected a file"
    assert not any("Traceback" in line for line in err)
    for option in ("nodes_path", "queries_path"):
        with pytest.raises(DataError, match=r"dir.tsv: is a directory, expected a file$"):
            import_triples(tsv(tmp_path), tmp_path / "ds", **{option: tmp_path / "dir.tsv"})
    with pytest.raises(DataError, match=r"missing.tsv: file not found$"):
        import_triples(tmp_path / "missing.tsv", tmp_path / "ds")
