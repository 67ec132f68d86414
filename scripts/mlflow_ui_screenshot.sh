#!/usr/bin/env bash
# Screenshot of the MLflow UI filtered by a chain tag (docs/provenance.md "Compare runs in the MLflow UI").
#
#   scripts/mlflow_ui_screenshot.sh [REPO] [OUT.png]
#
# REPO: a repository after `dvc repro` (its mlflow.db; default .). Needs a headless Chromium
# (Debian: apt-get install chromium). Filters the bertrace experiment on the pre-trained
# checkpoint's hash from REPO/data/provenance/pretrain.json: the runs that share it.
set -euo pipefail
REPO=$(cd "${1:-.}" && pwd)
OUT=$(realpath -m "${2:-docs/mlflow-ui.png}")
HERE=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$HERE/.venv/bin/python}
PORT=${PORT:-5077}
BROWSER=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
[ -n "$BROWSER" ] || { echo "error: no chromium found; apt-get install chromium" >&2; exit 2; }
[ -f "$REPO/mlflow.db" ] || { echo "error: $REPO/mlflow.db not found; run dvc repro there first" >&2; exit 2; }

read -r EXP FILTER < <("$PY" - "$REPO" <<'PYEOF'
import json, sys, urllib.parse
from pathlib import Path
import mlflow
repo = Path(sys.argv[1])
client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{repo}/mlflow.db")
exp = client.get_experiment_by_name("bertrace").experiment_id
best = json.loads((repo / "data/provenance/pretrain.json").read_text())["outputs"]["data/pretrain/best.pt"]
print(exp, urllib.parse.quote(f"tags.`bertrace.chain.pretrain_checkpoint_sha256` = '{best}'"))
PYEOF
)

"$(dirname "$PY")/mlflow" ui --backend-store-uri "sqlite:///$REPO/mlflow.db" --host 127.0.0.1 --port "$PORT" \
    >/tmp/mlflow-ui-$PORT.log 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 60); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 1; done
mkdir -p "$(dirname "$OUT")"
"$BROWSER" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1600,900 \
    --virtual-time-budget=20000 --screenshot="$OUT" \
    "http://127.0.0.1:$PORT/#/experiments/$EXP/runs?searchFilter=$FILTER" 2>/dev/null
echo "wrote $OUT"
