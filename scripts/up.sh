#!/bin/bash
# Installs what is missing, builds berth (release) into /usr/local/bin, and starts a single-node
# cluster with `berth up`: the control plane (API server, scheduler, controllers), the CRI runtime
# with the OCI runtimes that really run containers here (each proved, each given a RuntimeClass)
# and the node agent. Returns once the node is Ready and prints how to use it; `berth status` and
# `berth down` manage it afterwards. Arguments go to `berth up` (e.g. --foreground, --join FILE).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR="${BERTH_DATA_DIR:-/var/lib/berth}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/berth-target}"
bash scripts/install-deps.sh
cargo build --release --locked -p berth -p berth-monitor
BUILT="$CARGO_TARGET_DIR/release/berth"

# A cluster that is up keeps running the binary it started with: when the build changed it, stop
# the cluster (its containers keep running) so that the new binary takes over; `berth up` below
# picks every pod up again. An unchanged build leaves a running cluster alone.
if [[ -x /usr/local/bin/berth ]] && ! cmp -s "$BUILT" /usr/local/bin/berth; then
  /usr/local/bin/berth down --data-dir "$DATA_DIR" || true
fi
# Parts started by this script before `berth up` existed (pidfiles in the data dir): stopped by
# their pids, each checked to still be a berth process.
for part in agent server runtime; do
  pidfile="$DATA_DIR/$part.pid"
  [[ -f $pidfile ]] || continue
  pid=$(<"$pidfile")
  if [[ $pid =~ ^[0-9]+$ ]] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "berth $part"; then
    kill "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  fi
  rm -f "$pidfile"
done

install -m 0755 "$BUILT" /usr/local/bin/berth
# The per-container monitor: berth runtime looks for it next to its own executable.
install -m 0755 "$CARGO_TARGET_DIR/release/berth-monitor" /usr/local/bin/berth-monitor
exec /usr/local/bin/berth up --data-dir "$DATA_DIR" "$@"
