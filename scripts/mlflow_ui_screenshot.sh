#!/usr/bin/env bash
# Screenshot of the MLflow UI filtered by a chain tag (docs/provenance.md "Compare runs in the MLflow UI").
#
#   scripts/mlflow_ui_screenshot.sh [REPO] [OUT.png]
#
# REPO: a repository after `dvc repro` (its mlflow.db; default .). Needs a headless Chromium
# (Debian: apt-get install chromium). VIEW (env) picks the page:
#   pipelines (default): the parent runs, one per `dvc repro` / `dvc exp run`, stage runs nested;
#   compare: the two latest parent runs (or RUN_IDS=id1,id2) side by side (every stage's params and metrics);
#   (HEIGHT=1800: a taller page.)
#   chain: the runs that share the pre-trained checkpoint of REPO/data/provenance/pretrain.json.
set -euo pipefail
REPO=$(cd "${1:-.}" && pwd)
OUT=$(realpath -m "${2:-docs/mlflow-ui.png}")
HERE=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$HERE/.venv/bin/python}
PORT=${PORT:-5077}
BROWSER=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
[ -n "$BROWSER" ] || { echo "error: no chromium found; apt-get install chromium" >&2; exit 2; }
[ -f "$REPO/mlflow.db" ] || { echo "error: $REPO/mlflow.db not found; run dvc repro there first" >&2; exit 2; }

VIEW=${VIEW:-pipelines}
read -r PAGE < <("$PY" - "$REPO" "$VIEW" <<'PYEOF'
import json, sys, urllib.parse
from pathlib import Path
import mlflow
repo = Path(sys.argv[1])
client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{repo}/mlflow.db")
exp = client.get_experiment_by_name("bertrace").experiment_id
view = sys.argv[2]
if view == "chain":
    best = json.loads((repo / "data/provenance/pretrain.json").read_text())["outputs"]["data/pretrain/best.pt"]
    path = "runs?searchFilter=" + urllib.parse.quote(f"tags.`bertrace.chain.pretrain_checkpoint_sha256` = '{best}'")
    print(f"#/experiments/{exp}/{path}")
elif view == "pipelines":
    print(f"#/experiments/{exp}/runs?searchFilter=" + urllib.parse.quote("tags.`bertrace.run_kind` = 'pipeline'"))
else:
    import os
    chosen = [r for r in os.environ.get("RUN_IDS", "").split(",") if r]
    if not chosen:
        runs = client.search_runs([exp], filter_string="tags.`bertrace.run_kind` = 'pipeline'",
                                  order_by=["attributes.start_time DESC"], max_results=2)
        chosen = [r.info.run_id for r in runs]
    ids = ",".join(f'"{r}"' for r in chosen)
    print(f"#/compare-runs?runs=[{ids}]&experiments=[\"{exp}\"]")
PYEOF
)

"$(dirname "$PY")/mlflow" ui --backend-store-uri "sqlite:///$REPO/mlflow.db" --host 127.0.0.1 --port "$PORT" \
    >/tmp/mlflow-ui-$PORT.log 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 60); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 1; done
mkdir -p "$(dirname "$OUT")"
"$BROWSER" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1600,${HEIGHT:-900} \
    --virtual-time-budget=20000 --screenshot="$OUT" \
    "http://127.0.0.1:$PORT/$PAGE" 2>/dev/null
echo "wrote $OUT"
