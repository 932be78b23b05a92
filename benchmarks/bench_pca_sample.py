"""How far a PCA fitted on a sample of the node embeddings is from one fitted on all of them.

The features stage fits its PCA on ``reduce.fit_sample`` nodes drawn with ``reduce.seed`` (100K by
default), so that a 10M-node graph never has every embedding in one process. This reads the node
embeddings of an artifacts directory (its ``embed`` stage), fits the PCA on all rows and on samples of
each ``--samples`` size exactly as the stage draws them, and prints for each:

- the share of the total variance of *all* rows that the fitted axes keep (the full fit's is the most
  any ``dim`` axes can keep);
- how much of the full fit's subspace the sample's axes span (mean squared cosine of the principal
  angles, 1.0 when the subspaces are equal);
- the share of nodes whose nearest neighbour among 2,000 sampled nodes (by the stage's normalised
  features, so by cosine) is the same under both fits (axes may turn within the subspace; neighbours
  do not care).

The ceiling (how often the subgraph holds an answer) needs the whole pipeline: run preprocessing a
second time with ``reduce.fit_sample=N`` and compare the two summaries (README, "Scaling out").

    python benchmarks/bench_pca_sample.py --artifacts runs/metaqa/artifacts --samples 2000,5000,10000,20000
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from seeder.data.store import open_dataset
from seeder.features.embed import apply_pca, fit_pca
from seeder.preprocessing.stages import embed_inputs, read_embeddings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", required=True, help="an artifacts directory with a finished embed stage")
    parser.add_argument("--samples", default="2000,5000,10000,20000", help="comma-separated sample sizes")
    parser.add_argument("--dim", type=int, default=0, help="PCA dimension (default: the artifacts' reduce.dim)")
    parser.add_argument("--seed", type=int, default=None, help="sample seed (default: the artifacts' reduce.seed)")
    args = parser.parse_args()
    artifacts = Path(args.artifacts)
    manifest = json.loads((artifacts / "manifest.json").read_text())
    reduce = manifest["config"]["reduce"]
    dim, seed = args.dim or reduce["dim"], reduce["seed"] if args.seed is None else args.seed
    kg = open_dataset(manifest["dataset"])
    nodes = read_embeddings(artifacts / "embed" / "nodes", embed_inputs(kg)["node"][0])
    total = float(np.var(nodes, axis=0, dtype=np.float64).sum())
    print(f"{len(nodes):,} node embeddings of {nodes.shape[1]} dims, PCA to {dim}, sample seed {seed}")

    full = fit_pca(nodes, dim, len(nodes), seed)
    full_features = apply_pca(nodes, full)
    probe = np.random.default_rng(seed + 1).choice(len(nodes), size=min(2_000, len(nodes)), replace=False)

    def nearest(features: np.ndarray) -> np.ndarray:
        scores = features @ features[probe].T
        scores[probe, np.arange(len(probe))] = -np.inf  # a node is not its own neighbour
        return scores.argmax(axis=1)

    full_nearest = nearest(full_features)
    print(f"{'sample':>8} {'variance kept':>14} {'subspace':>9} {'same nearest':>13}")
    for size in [int(x) for x in args.samples.split(",")] + [len(nodes)]:
        pca = fit_pca(nodes, dim, size, seed)
        centered = nodes - pca.mean
        kept = float(np.var(centered @ pca.components.T, axis=0, dtype=np.float64).sum()) / total
        subspace = float(np.square(np.linalg.svd(pca.components @ full.components.T, compute_uv=False)).mean())
        same = float((nearest(apply_pca(nodes, pca)) == full_nearest).mean())
        label = "all" if size >= len(nodes) else f"{size:,}"
        print(f"{label:>8} {kept:14.4f} {subspace:9.4f} {same:13.4f}")


if __name__ == "__main__":
    main()
