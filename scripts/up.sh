#!/bin/bash
# Installs what is missing, builds berth, and starts in the background a single-node control plane
# on the embedded store and the CRI runtime. Then: export KUBECONFIG=$DATA_DIR/admin.kubeconfig
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR="${BERTH_DATA_DIR:-/var/lib/berth}"
LOG="${BERTH_LOG_FILE:-/var/log/berth-server.log}"
RUNTIME_LOG="${BERTH_RUNTIME_LOG_FILE:-/var/log/berth-runtime.log}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/berth-target}"
bash scripts/install-deps.sh
cargo build --release --locked -p berth -p berth-monitor
install -m 0755 "$CARGO_TARGET_DIR/release/berth" /usr/local/bin/berth
# The per-container monitor: berth runtime looks for it next to its own executable.
install -m 0755 "$CARGO_TARGET_DIR/release/berth-monitor" /usr/local/bin/berth-monitor

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
for _ in $(seq 1 100); do
  if [[ -f "$DATA_DIR/admin.kubeconfig" ]] && KUBECONFIG="$DATA_DIR/admin.kubeconfig" kubectl get --raw /readyz >/dev/null 2>&1 \
    && /usr/local/bin/berth cri version >/dev/null 2>&1; then
    echo "up: berth server and berth runtime are ready (logs: $LOG, $RUNTIME_LOG)"
    echo "export KUBECONFIG=$DATA_DIR/admin.kubeconfig"
    exit 0
  fi
  sleep 0.2
done
echo "up: berth did not become ready; last log lines:" >&2
tail -20 "$LOG" "$RUNTIME_LOG" >&2
exit 1
