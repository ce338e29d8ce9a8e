#!/usr/bin/env bash
# Serve kepsilon on a local Prefect server: the API and UI on http://127.0.0.1:${PREFECT_PORT:-4200},
# the deployments of deployments/prefect.yaml on the process work pool `kepsilon-process`, and a worker
# that runs them. PREFECT_PORT and PREFECT_HOME (default ./.prefect) may be set to run a second instance.
#
# The server requires a login (Prefect's basic authentication, server.api.auth_string): a secret generated on
# first use, printed once, kept owner-only in KEPSILON_PREFECT_AUTH_FILE (default ./.kepsilon/prefect-server.auth).
# Only the server gets PREFECT_SERVER_API_AUTH_STRING; the prefect commands, the worker and the flow runs it
# starts send PREFECT_API_AUTH_STRING; `kepsilon release` reads the same file (docs/logins.md).
#
# Scheduled and UI-launched releases sign as the deployment's service principal (docs/identity.md): the key file
# named by KEPSILON_SERVICE_KEY, checked before the server starts (a key that could not sign a release in this
# store stops make serve with one line), is given to the worker alone, as KEPSILON_SIGNING_KEY; the flow runs it
# starts inherit it. The server and the prefect commands never get it, and a KEPSILON_SIGNING_KEY of the shell
# that starts make serve (a person's own key) is dropped: the deployment never signs as a person.
#
# One Ctrl-C (or one SIGINT/SIGTERM to this script or its process group) stops the worker, then the
# server, within 10 s: the worker first, so it can say goodbye to a server that is still there; SIGINT,
# because a Prefect worker ignores SIGTERM; SIGKILL for whatever still runs after its grace period.
set -euo pipefail
# A relative key path means one relative to where make serve was started, not to the project root.
service_key=${KEPSILON_SERVICE_KEY:-}
[ -z "$service_key" ] || [[ "$service_key" = /* ]] || service_key="$PWD/$service_key"
unset KEPSILON_SERVICE_KEY KEPSILON_SIGNING_KEY
cd "$(dirname "$0")/.."
BIN=.venv/bin
PORT=${PREFECT_PORT:-4200}
export PREFECT_HOME=${PREFECT_HOME:-$PWD/.prefect}
export KEPSILON_PROJECT_DIR="$PWD"
export PREFECT_API_URL="http://127.0.0.1:${PORT}/api"
mkdir -p "$PREFECT_HOME"
KEPSILON_SERVICE_KEY="$service_key" "$BIN/python" -m kepsilon.service_key check
login=$("$BIN/python" -m kepsilon.prefect_login secret)

server=""
worker=""

# Start "$@" in the background in a process group of its own; its pid (= its process group id) is left in
# $started. Job control (set -m) is on only for the fork: without it bash starts background commands with SIGINT
# ignored, and a worker that ignores both SIGINT and SIGTERM cannot be stopped. Its own group also keeps
# a terminal's Ctrl-C from reaching it directly, so the stop order below is ours, not a race.
start_group() {
  set -m
  "$@" < /dev/null &
  started=$!
  set +m
}

running() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

# SIGINT to one child's process group, then up to $2 seconds for the child to exit.
stop_group() {
  local pid=$1 seconds=$2
  running "$pid" || return 0
  kill -INT -- "-$pid" 2>/dev/null || true
  local ticks=$((seconds * 5))
  while running "$pid" && [ "$ticks" -gt 0 ]; do
    sleep 0.2
    ticks=$((ticks - 1))
  done
}

stop_all() {
  local status=$1
  trap - INT TERM EXIT
  if running "$worker" || running "$server"; then echo "stopping the worker and the server…" >&2; fi
  stop_group "$worker" 5
  stop_group "$server" 3
  # Whatever is left in either group after its grace period (a hung shutdown, a grandchild) is killed.
  for pid in $worker $server; do kill -KILL -- "-$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  exit "$status"
}
trap 'stop_all 130' INT
trap 'stop_all 143' TERM
trap 'stop_all $?' EXIT

# The server's setting is in the environment of the server alone (set for the fork, then taken back).
export PREFECT_SERVER_API_AUTH_STRING="$login"
start_group "$BIN/prefect" server start --host 127.0.0.1 --port "$PORT" > "$PREFECT_HOME/server.log" 2>&1
server=$started
unset PREFECT_SERVER_API_AUTH_STRING
export PREFECT_API_AUTH_STRING="$login"
for _ in $(seq 1 120); do
  running "$server" || break
  curl -fsS "$PREFECT_API_URL/health" > /dev/null 2>&1 && break
  sleep 1
done
curl -fsS "$PREFECT_API_URL/health" > /dev/null 2>&1 || {
  echo "Prefect server did not start; see $PREFECT_HOME/server.log" >&2
  exit 1
}

"$BIN/prefect" work-pool create kepsilon-process --type process --overwrite > /dev/null
"$BIN/prefect" --no-prompt deploy --all --prefect-file deployments/prefect.yaml
echo "Prefect UI: http://127.0.0.1:${PORT}  (Deployments → governed-release/paper-synthetic-nightly → Run → Custom run)"
echo "  its login form asks for the whole string kept in ${KEPSILON_PREFECT_AUTH_FILE:-.kepsilon/prefect-server.auth}"
start_group env ${service_key:+KEPSILON_SIGNING_KEY="$service_key"} "$BIN/prefect" worker start --pool kepsilon-process
worker=$started
echo "Ctrl-C stops the worker and the server."

# Until Ctrl-C, or until either of them exits on its own (a worker without its server only prints errors).
set +e
wait -n "$server" "$worker"
status=$?
set -e
running "$server" || echo "the Prefect server stopped (exit $status); see $PREFECT_HOME/server.log" >&2
running "$worker" || echo "the worker stopped (exit $status)" >&2
stop_all "$status"
