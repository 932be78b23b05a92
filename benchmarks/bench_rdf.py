"""Time and peak memory of `seeder import rdf` on a synthetic N-Triples file, 5M triples by default.

The file describes N/10 entities, each with a type, an English and a French label, an English comment
and six edges over ten relations (classes and relations have labels too), so every path of the
importer runs: IRI edges, labels by language, descriptions, types. Each command runs in its own
process; peak memory is that process's largest RSS (``ru_maxrss``). Figures are printed next to references measured
in the same run:

- floor: pyoxigraph's parser iterated over the same file, doing nothing with the triples (what any
  importer built on it must at least pay); the ratio says what columns, interning, labels, types,
  validation, Parquet and the CSR cost on top;
- triples: `seeder import triples` on the same file's edges as TSV (the six IRI-to-IRI triples per
  entity), per edge.

Nothing is asserted.

    python benchmarks/bench_rdf.py [--triples 5000000] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

EX = "http://example.org/"
RDF_TYPE = "<http://www.w3.org/1999/02/22-rdf-syntax-ns#type>"
LABEL = "<http://www.w3.org/2000/01/rdf-schema#label>"
COMMENT = "<http://www.w3.org/2000/01/rdf-schema#comment>"
CLASSES, RELATIONS, EDGES_PER_ENTITY = 20, 10, 6
TRIPLES_PER_ENTITY = 4 + EDGES_PER_ENTITY

FLOOR = """
import sys, pyoxigraph
n = 0
for _ in pyoxigraph.parse(path=sys.argv[1]):
    n += 1
print(n)
"""


def write_files(folder: Path, triples: int, block: int = 100_000) -> tuple[Path, Path, int]:
    """The N-Triples file, the same edges as a TSV file, and the number of triples written."""
    entities = max(1, triples // TRIPLES_PER_ENTITY)
    rng = np.random.default_rng(0)
    nt, tsv = folder / f"synthetic_{triples}.nt", folder / f"synthetic_{triples}.tsv"
    written = 0
    with open(nt, "w", encoding="utf-8") as out, open(tsv, "w", encoding="utf-8") as edges:
        edges.write("head\trelation\ttail\n")
        for c in range(CLASSES):
            out.write(f'<{EX}class/C{c}> {LABEL} "class {c}"@en .\n')
        for r in range(RELATIONS):
            out.write(f'<{EX}relation/r{r}> {LABEL} "relation {r}"@en .\n')
        written += CLASSES + RELATIONS
        for start in range(0, entities, block):
            ids = range(start, min(start + block, entities))
            targets = rng.integers(0, entities, size=(len(ids), EDGES_PER_ENTITY))
            lines, rows = [], []
            for i, tails in zip(ids, targets.tolist()):
                e = f"<{EX}entity/e{i}>"
                lines.append(
                    f"{e} {RDF_TYPE} <{EX}class/C{i % CLASSES}> .\n"
                    f'{e} {LABEL} "entity {i}"@en .\n'
                    f'{e} {LABEL} "entité {i}"@fr .\n'
                    f'{e} {COMMENT} "Entity number {i}, of class {i % CLASSES}."@en .\n'
                )
                for k, t in enumerate(tails):
                    r = (i + k) % RELATIONS
                    lines.append(f"{e} <{EX}relation/r{r}> <{EX}entity/e{t}> .\n")
                    rows.append(f"e{i}\tr{r}\te{t}\n")
            out.writelines(lines)
            edges.writelines(rows)
            written += len(ids) * TRIPLES_PER_ENTITY
    return nt, tsv, written


def measure(label: str, cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS in MiB) of ``cmd``, run as a child process; a failure stops the benchmark
    with its output. The peak is the child's own ``ru_maxrss`` (from ``os.wait4``): exact even for a run
    shorter than a sampling interval."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        sys.exit(f"{label} failed ({code}):\n{''.join(output.splitlines(keepends=True)[-15:])}")
    return wall, usage.ru_maxrss / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--triples", type=int, default=5_000_000, help="size of the synthetic N-Triples file")
    parser.add_argument("--workdir", help="where the files and datasets go (default: a temporary directory)")
    args = parser.parse_args()
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))
    os.environ.setdefault("SEEDER_PROGRESS", "off")

    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        nt, tsv, triples = write_files(work, args.triples)
        edges = (triples - CLASSES - RELATIONS) // TRIPLES_PER_ENTITY * EDGES_PER_ENTITY
        size_mb = nt.stat().st_size / 1e6
        print(f"{nt.name}: {triples:,} triples ({edges:,} IRI-to-IRI), {size_mb:,.0f} MB")

        py = sys.executable
        floor_s, floor_mb = measure("parse only", [py, "-c", FLOOR, str(nt)])
        rdf_s, rdf_mb = measure(
            "seeder import rdf", [py, "-m", "seeder.cli", "import", "rdf", str(nt), "--out", str(work / "rdf")]
        )
        tsv_s, tsv_mb = measure(
            "seeder import triples",
            [py, "-m", "seeder.cli", "import", "triples", "--triples", str(tsv), "--out", str(work / "tsv")],
        )

        print(f"\n{'':24}{'wall s':>9}{'triples/s':>12}{'peak RSS MiB':>14}")
        for label, wall, mb, n in (
            ("parse only (floor)", floor_s, floor_mb, triples),
            ("seeder import rdf", rdf_s, rdf_mb, triples),
            ("seeder import triples", tsv_s, tsv_mb, edges),
        ):
            print(f"{label:24}{wall:9.2f}{n / wall:12,.0f}{mb:14,.0f}")
        print(f"\nimport rdf / parse floor, time:          {rdf_s / floor_s:.2f}x")
        print(
            f"import rdf / import triples, per edge:   {rdf_s / tsv_s:.2f}x (the RDF file has {triples / edges:.2f} triples per edge)"
        )
        print(f"import rdf peak RSS per million triples: {rdf_mb / (triples / 1e6):,.0f} MiB")
        print(f"import rdf throughput:                   {size_mb / rdf_s:,.1f} MB/s of N-Triples")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
