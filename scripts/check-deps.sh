#!/bin/bash
# Fails when a crate of the workspace declares a dependency its code never names, as
# `cargo machete` would: each dependency's crate name must appear in the crate's sources
# (src/, tests/, benches/, examples/, build.rs). A dependency needed without being named (a
# feature switch, a linked library) says so on its line with `# unnamed: <why>`.
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
for manifest in crates/*/Cargo.toml; do
  dir=$(dirname "$manifest")
  sources=()
  for d in src tests benches examples build.rs; do [ -e "$dir/$d" ] && sources+=("$dir/$d"); done
  # Dependency names from the [*dependencies] tables: `name = …`, `name.workspace = true`,
  # and `package = "…"` renames (the name in code is the key).
  deps=$(awk '
    /^\[/ { in_deps = ($0 ~ /^\[(dev-|build-)?dependencies\]$/) ; next }
    in_deps && /^[A-Za-z0-9_-]+(\.workspace)? *=/ && $0 !~ /# unnamed:/ {
      split($0, parts, /[ .=]/); print parts[1]
    }' "$manifest")
  for dep in $deps; do
    name=${dep//-/_}
    if ! grep -rqwE "$name" "${sources[@]}"; then
      echo "check-deps: $manifest declares $dep, which its code never names" >&2
      status=1
    fi
  done
done
exit $status
