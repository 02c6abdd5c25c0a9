#!/bin/bash
# Lets crun run on a cgroup v1 "hybrid" host. Idempotent; run as root.
#
# Such a host mounts the v1 controllers under /sys/fs/cgroup/<ctrl> plus a cgroup2 hierarchy at
# /sys/fs/cgroup/unified, and every controller not mounted as v1 (here: hugetlb) belongs to cgroup2.
# crun 1.8 then refuses every container: "cgroups in hybrid mode not supported, drop all
# controllers from cgroupv2". runc and runsc do not mind.
#
# The fix mounts each controller that cgroup2 still owns as its own v1 hierarchy at
# /sys/fs/cgroup/<ctrl>; cgroup2 is left with no controllers and crun accepts the layout.
# Nothing else changes and no reboot is needed. To undo: umount /sys/fs/cgroup/<ctrl> (the
# controller returns to cgroup2 only once its v1 hierarchy has no child cgroups left).
set -euo pipefail
[[ $EUID -eq 0 ]] || { echo "fix-crun-hybrid: must run as root" >&2; exit 1; }

UNIFIED=/sys/fs/cgroup/unified/cgroup.controllers
if [[ ! -r $UNIFIED ]]; then
  echo "fix-crun-hybrid: no hybrid cgroup layout (no $UNIFIED); nothing to do"
  exit 0
fi

for c in $(<"$UNIFIED"); do
  mnt=/sys/fs/cgroup/$c
  if mountpoint -q "$mnt"; then
    continue
  fi
  mkdir -p "$mnt"
  mount -t cgroup -o "$c" cgroup "$mnt"
  echo "fix-crun-hybrid: mounted cgroup v1 controller $c on $mnt"
done

left=$(<"$UNIFIED")
if [[ -n $left ]]; then
  echo "fix-crun-hybrid: cgroup2 still owns: $left" >&2
  exit 1
fi
echo "fix-crun-hybrid: cgroup2 owns no controllers; crun can run"
