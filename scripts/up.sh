#!/bin/bash
# Installs what is missing, builds berth, and starts in the background a single-node control plane
# on the embedded store, the CRI runtime and the node agent for this machine, and waits until the
# Node is Ready. Then: export KUBECONFIG=$DATA_DIR/admin.kubeconfig
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR="${BERTH_DATA_DIR:-/var/lib/berth}"
LOG="${BERTH_LOG_FILE:-/var/log/berth-server.log}"
RUNTIME_LOG="${BERTH_RUNTIME_LOG_FILE:-/var/log/berth-runtime.log}"
AGENT_LOG="${BERTH_AGENT_LOG_FILE:-/var/log/berth-agent.log}"
NODE_NAME="${BERTH_NODE_NAME:-$(hostname | tr '[:upper:]' '[:lower:]')}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/berth-target}"
bash scripts/install-deps.sh
cargo build --release --locked -p berth -p berth-monitor
install -m 0755 "$CARGO_TARGET_DIR/release/berth" /usr/local/bin/berth
# The per-container monitor: berth runtime looks for it next to its own executable.
install -m 0755 "$CARGO_TARGET_DIR/release/berth-monitor" /usr/local/bin/berth-monitor

# The agent goes first, so it does not report the runtime and server restarts below.
if [[ -f "$DATA_DIR/agent.pid" ]] && kill -0 "$(cat "$DATA_DIR/agent.pid")" 2>/dev/null; then
  kill "$(cat "$DATA_DIR/agent.pid")"
  while kill -0 "$(cat "$DATA_DIR/agent.pid")" 2>/dev/null; do sleep 0.1; done
fi
if [[ -f "$DATA_DIR/server.pid" ]] && kill -0 "$(cat "$DATA_DIR/server.pid")" 2>/dev/null; then
  echo "up: berth server already running (pid $(cat "$DATA_DIR/server.pid")), restarting it"
  kill "$(cat "$DATA_DIR/server.pid")"
  while kill -0 "$(cat "$DATA_DIR/server.pid")" 2>/dev/null; do sleep 0.1; done
fi
mkdir -p "$DATA_DIR"
# The CRI runtime: handlers from /etc/berth/runtime.toml, or the runc/crun/runsc found on PATH.
if [[ -f "$DATA_DIR/runtime.pid" ]] && kill -0 "$(cat "$DATA_DIR/runtime.pid")" 2>/dev/null; then
  kill "$(cat "$DATA_DIR/runtime.pid")"
  while kill -0 "$(cat "$DATA_DIR/runtime.pid")" 2>/dev/null; do sleep 0.1; done
fi
nohup /usr/local/bin/berth runtime >>"$RUNTIME_LOG" 2>&1 &
echo $! >"$DATA_DIR/runtime.pid"
nohup /usr/local/bin/berth server --data-dir "$DATA_DIR" >>"$LOG" 2>&1 &
echo $! >"$DATA_DIR/server.pid"
ready=
for _ in $(seq 1 100); do
  if [[ -f "$DATA_DIR/admin.kubeconfig" ]] && KUBECONFIG="$DATA_DIR/admin.kubeconfig" kubectl get --raw /readyz >/dev/null 2>&1 \
    && /usr/local/bin/berth cri version >/dev/null 2>&1; then
    ready=1
    break
  fi
  sleep 0.2
done
if [[ -z "$ready" ]]; then
  echo "up: berth did not become ready; last log lines:" >&2
  tail -20 "$LOG" "$RUNTIME_LOG" >&2
  exit 1
fi

# The node agent for this machine, with the berth runtime as its endpoint. Its credentials: a node
# token when the server can issue one, else the admin kubeconfig.
NODE_KUBECONFIG="$DATA_DIR/admin.kubeconfig"
if /usr/local/bin/berth server token create --help >/dev/null 2>&1; then
  NODE_KUBECONFIG="$DATA_DIR/$NODE_NAME.kubeconfig"
  if [[ ! -s "$NODE_KUBECONFIG" ]]; then
    /usr/local/bin/berth server token create --node "$NODE_NAME" --data-dir "$DATA_DIR" >"$NODE_KUBECONFIG.tmp"
    mv "$NODE_KUBECONFIG.tmp" "$NODE_KUBECONFIG"
  fi
fi
AGENT_ARGS=(--kubeconfig "$NODE_KUBECONFIG" --node-name "$NODE_NAME")
if [[ -f /etc/berth/agent.toml ]]; then
  AGENT_ARGS+=(--config /etc/berth/agent.toml)
else
  AGENT_ARGS+=(--container-runtime-endpoint "container:berth:unix:///run/berth/runtime.sock")
fi
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
nohup /usr/local/bin/berth agent "${AGENT_ARGS[@]}" >>"$AGENT_LOG" 2>&1 &
echo $! >"$DATA_DIR/agent.pid"
# Ready as reported by this agent: a Node left by an earlier one may still say Ready.
for _ in $(seq 1 300); do
  ready=$(KUBECONFIG="$DATA_DIR/admin.kubeconfig" kubectl get node "$NODE_NAME" \
    -o jsonpath='{range .status.conditions[?(@.type=="Ready")]}{.status} {.lastHeartbeatTime}{end}' 2>/dev/null || true)
  if [[ "${ready%% *}" == "True" && ! "${ready#* }" < "$started" ]]; then
    echo "up: berth server, berth runtime and berth agent are ready; node $NODE_NAME is Ready (logs: $LOG, $RUNTIME_LOG, $AGENT_LOG)"
    echo "export KUBECONFIG=$DATA_DIR/admin.kubeconfig"
    exit 0
  fi
  if ! kill -0 "$(cat "$DATA_DIR/agent.pid")" 2>/dev/null; then
    break
  fi
  sleep 0.2
done
echo "up: node $NODE_NAME did not become Ready; last log lines:" >&2
tail -20 "$AGENT_LOG" "$RUNTIME_LOG" >&2
exit 1
