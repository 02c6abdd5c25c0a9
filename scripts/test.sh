#!/bin/bash
# Runs every test tier: formatting, lints, unit tests, integration tests against real etcd and
# SQLite, and end-to-end tests that drive the berth binary with the real kubectl.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/berth-target}"
bash scripts/install-deps.sh
cargo fmt --all --check
bash scripts/check-deps.sh
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked --no-fail-fast
