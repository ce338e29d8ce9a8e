#!/usr/bin/env bash
# Serve kepsilon on a local Prefect server: the API and UI on http://127.0.0.1:${PREFECT_PORT:-4200},
# the deployments of deployments/prefect.yaml on the process work pool `kepsilon-process`, and a worker
# that runs them. Ctrl-C stops the worker and the server (the worker ignores SIGTERM; SIGINT stops it).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
PORT=${PREFECT_PORT:-4200}
export KEPSILON_PROJECT_DIR="$PWD"
export PREFECT_API_URL="http://127.0.0.1:${PORT}/api"
mkdir -p "${PREFECT_HOME:-.prefect}"

"$BIN/prefect" server start --host 127.0.0.1 --port "$PORT" > "${PREFECT_HOME:-.prefect}/server.log" 2>&1 &
server=$!
trap 'kill -INT "$server" 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  curl -fsS "$PREFECT_API_URL/health" > /dev/null 2>&1 && break
  sleep 1
done
curl -fsS "$PREFECT_API_URL/health" > /dev/null || { echo "Prefect server did not start; see ${PREFECT_HOME:-.prefect}/server.log"; exit 1; }

"$BIN/prefect" work-pool create kepsilon-process --type process --overwrite > /dev/null
"$BIN/prefect" --no-prompt deploy --all --prefect-file deployments/prefect.yaml
echo "Prefect UI: http://127.0.0.1:${PORT}  (Deployments → governed-release/paper-synthetic-nightly → Run → Custom run)"
"$BIN/prefect" worker start --pool kepsilon-process
