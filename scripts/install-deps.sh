#!/bin/bash
# Installs the Debian packages berth needs to build, run and test; only what is missing.
# Packaged services (etcd, docker-registry) must not start on install: a temporary policy-rc.d
# denies service starts unless the host already has one.
set -euo pipefail
[[ $EUID -eq 0 ]] || { echo "install-deps: must run as root" >&2; exit 1; }

PKGS=(
  build-essential pkg-config protobuf-compiler libprotobuf-dev   # building (protoc + well-known types)
  ca-certificates curl jq python3 iproute2 util-linux procps iptables
  nftables kmod conntrack                        # the Service proxy (nft; modprobe br_netfilter; stale UDP flows); nftables' service never starts here
  etcd-server etcd-client                        # the etcd store backend and its tests
  runc crun runsc containerd                     # OCI runtimes; containerd is the CRI peer
  containernetworking-plugins                    # CNI plugins in /usr/lib/cni
  docker-registry apache2-utils skopeo umoci busybox-static   # test registry and images
  hyperfine                                      # benchmarks of the raw floors
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done
# crun cannot run on a cgroup v1 hybrid host until cgroup2 owns no controllers (idempotent).
fix_crun() { "$(dirname "$0")/fix-crun-hybrid.sh"; }
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  fix_crun
  exit 0
fi
echo "install-deps: installing ${missing[*]}"

POLICY=/usr/sbin/policy-rc.d
if [[ ! -e $POLICY ]]; then
  printf '#!/bin/sh\nexit 101\n' >"$POLICY"
  chmod 755 "$POLICY"
  trap 'rm -f "$POLICY"' EXIT
fi
export DEBIAN_FRONTEND=noninteractive
LOG=$(mktemp /tmp/berth-install-deps.XXXXXX.log)
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$LOG" 2>&1; then
  tail -20 "$LOG" >&2
  echo "install-deps: apt-get failed, full log: $LOG" >&2
  exit 1
fi
rm -f "$LOG"
# The packages may have started their services despite policy-rc.d on some hosts; berth starts
# its own. Stop only those packaged units (never processes by name: the user may run their own).
if command -v systemctl >/dev/null && [[ -d /run/systemd/system ]]; then
  for unit in etcd docker-registry; do
    systemctl disable --now "$unit" >/dev/null 2>&1 || true
  done
fi
fix_crun
echo "install-deps: done"
