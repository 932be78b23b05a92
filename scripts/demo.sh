#!/usr/bin/env bash
# The main job end to end on the built-in synthetic graph: generate, import, validate, preprocess on Ray
# Data, train on Ray Train, evaluate against the reference retrievers. `make demo` runs this after
# setting up .venv; everything lands in $SEEDER_DEMO_DIR (default runs/demo).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 MLFLOW_DISABLE_TELEMETRY=true PYTHONUNBUFFERED=1
OUT=${SEEDER_DEMO_DIR:-runs/demo}
CONFIG=configs/synth_default.yaml
mkdir -p "$OUT"

# Each step header shows the time so far, so that a slow step stands out.
step() { printf '\n== [%dm%02ds] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }

step "1/5 generate the synthetic relation-tracing graph (paper, Definition B.1) and validate it"
seeder synth --config "$CONFIG" --out "$OUT/dataset" --overwrite
seeder info "$OUT/dataset"

step "2/5 preprocess on Ray Data: MiniLM embeddings, PCA, seeds, bounded K-hop subgraphs"
python pipelines/preprocess.py --dataset "$OUT/dataset" --out "$OUT/artifacts" --config "$CONFIG"

step "3/5 train the SeedER policy on Ray Train (REINFORCE + BPR), logged to MLflow"
rm -rf "$OUT/model"  # a new run each time (the data may have changed); earlier runs stay in MLflow
python pipelines/train.py --artifacts "$OUT/artifacts" --config "$CONFIG" --out "$OUT/model" --experiment demo

step "4/5 evaluate on the test split: Dense, K-HOP-W-FILTER and SeedER side by side"
seeder evaluate --artifacts "$OUT/artifacts" --split test \
  --method dense --method khop --method seeder --model "$OUT/model/model" --json "$OUT/test_metrics.json"

step "5/5 ask one question"
question=$(python - "$OUT/dataset" <<'PY'
import sys
from seeder.data.store import open_dataset
print(open_dataset(sys.argv[1]).queries_of("test").column("text")[0])
PY
)
seeder retrieve --model "$OUT/model/model" -k 5 "$question"

printf '\nDone in %dm%02ds. Results: %s/test_metrics.json; runs: `seeder ui` then open http://127.0.0.1:5000\n' $((SECONDS / 60)) $((SECONDS % 60)) "$OUT"
