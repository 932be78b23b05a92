"""Time and peak memory of `seeder synth` and of the import -> CSR write, at 1M nodes / 10M edges by default.

Each measurement runs in a fresh child process, and its peak resident memory is that child's own
``ru_maxrss`` (from ``os.wait4``): numpy allocations are invisible to tracemalloc. Figures are
printed next to references measured in the same run:

- scaling: the same synth at 1/10 of the size (time and memory per edge should stay about flat);
- floor: drawing the same permutations with numpy and saving the raw arrays with ``np.save``
  (what any generator must at least pay); the ratio says what names, texts, queries, validation,
  Parquet and CSR cost on top.

    python benchmarks/bench_synth.py [--nodes 1000000 --relations 10]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLOOR = """
import sys, numpy as np
n, k, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rng = np.random.default_rng(0)
sigma = np.stack([rng.permutation(n) for _ in range(k)])
np.save(out + "/src.npy", np.tile(np.arange(n), k)); np.save(out + "/dst.npy", sigma.reshape(-1))
np.save(out + "/rel.npy", np.repeat(np.arange(k, dtype=np.int32), n))
"""

REWRITE = """
import json, sys, time
import pyarrow.parquet as pq
from seeder.data.store import build_csr, write_dataset
src_dir, out = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
tables = [pq.read_table(f"{src_dir}/{name}.parquet") for name in ("nodes", "relations", "edges", "queries")]
t1 = time.perf_counter()
e = tables[2]
build_csr(tables[0].num_rows, tables[1].num_rows, e.column("src").to_numpy(), e.column("dst").to_numpy(),
          e.column("relation").to_numpy())
t2 = time.perf_counter()
write_dataset(out, *tables)
t3 = time.perf_counter()
print(json.dumps({"read_s": t1 - t0, "csr_s": t2 - t1, "write_dataset_s": t3 - t2}))
"""


def run_child(cmd: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS in MiB, stdout) of one child process."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    stdout = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"child failed ({proc.returncode}): {' '.join(cmd)}")
    return wall, usage.ru_maxrss / 1024, stdout


def synth_cmd(out: Path, nodes: int, relations: int, queries: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "seeder.cli",
        "synth",
        "--out",
        str(out),
        "--nodes",
        str(nodes),
        "--relations",
        str(relations),
        "--queries",
        str(queries),
        "--hubs",
        "0",
        "--multi-answer-frac",
        "0",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--relations", type=int, default=10)
    parser.add_argument("--queries", type=int, default=10_000)
    args = parser.parse_args()
    edges = args.nodes * args.relations
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        small_wall, small_rss, _ = run_child(synth_cmd(tmp / "small", args.nodes // 10, args.relations, args.queries // 10))
        wall, rss, _ = run_child(synth_cmd(tmp / "full", args.nodes, args.relations, args.queries))
        (tmp / "floor").mkdir()
        floor_wall, floor_rss, _ = run_child(
            [sys.executable, "-c", FLOOR, str(args.nodes), str(args.relations), str(tmp / "floor")]
        )
        re_wall, re_rss, out = run_child([sys.executable, "-c", REWRITE, str(tmp / "full"), str(tmp / "rewrite")])
        phases = json.loads(out)
        size_mb = sum(p.stat().st_size for p in (tmp / "full").rglob("*") if p.is_file()) / 2**20

    print(f"seeder synth: {args.nodes:,} nodes, {edges:,} edges, {args.queries:,} queries ({size_mb:,.0f} MiB on disk)")
    print(f"  wall {wall:.2f} s   peak RSS {rss:,.0f} MiB   ({rss * 2**20 / edges:.0f} bytes per edge)")
    print(
        f"  1/10 size reference: wall {small_wall:.2f} s, peak RSS {small_rss:,.0f} MiB "
        f"-> time x{wall / small_wall:.1f} and memory x{rss / small_rss:.1f} for 10x the size"
    )
    print(
        f"  numpy floor (permutations + np.save): wall {floor_wall:.2f} s, peak RSS {floor_rss:,.0f} MiB "
        f"-> synth costs x{wall / floor_wall:.1f} the floor's time, x{rss / floor_rss:.1f} its memory"
    )
    print(f"import -> CSR write (child reads the {edges:,}-edge tables back and writes a dataset):")
    print(
        f"  read Parquet {phases['read_s']:.2f} s, build_csr alone {phases['csr_s']:.2f} s, "
        f"write_dataset (validate + Parquet + CSR + manifest) {phases['write_dataset_s']:.2f} s; "
        f"child wall {re_wall:.2f} s, peak RSS {re_rss:,.0f} MiB"
    )


if __name__ == "__main__":
    main()
