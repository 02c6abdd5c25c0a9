#!/bin/bash
# runsc as the BinaryName of containerd's io.containerd.runc.v2 shim, for the `gvisor` handler of
# the containerd that berth_testenv::Containerd starts (Debian ships no containerd-shim-runsc-v1).
#
# - create: runsc turns a container carrying the CRI annotations container-type=container and
#   sandbox-id into a sub-container of the pause container's gVisor sandbox, a process the runc
#   shim cannot follow (StartContainer never returns). Without them every container is its own
#   gVisor sandbox that joins the pod's namespaces by path, as a runc container does.
# - kill: runsc reports an exited sandbox as "sandbox is not running"; the shim only treats
#   runc's "container not running" as already gone, so StopPodSandbox would fail.
# - ptrace is the only usable platform without KVM, and runsc's netstack refuses to start on this
#   kernel, so it uses the pod's netns directly (--network=host).
set -u
RUNSC=(runsc --platform=ptrace --network=host)

command=""
bundle=""
previous=""
for arg in "$@"; do
  case $previous in
    --bundle | -bundle | -b) bundle=$arg ;;
  esac
  case $arg in
    --bundle=* | -bundle=*) bundle=${arg#*=} ;;
  esac
  if [[ -z $command ]]; then
    case $arg in
      create | kill | start | delete | state | exec | ps | run | events | pause | resume | update) command=$arg ;;
    esac
  fi
  previous=$arg
done

if [[ $command == create && -n $bundle ]]; then
  config=$bundle/config.json
  jq 'if .annotations then .annotations |= del(."io.kubernetes.cri.container-type", ."io.kubernetes.cri.sandbox-id") else . end' \
    "$config" >"$config.new" && mv "$config.new" "$config" || exit 1
fi

if [[ $command == kill ]]; then
  output=$("${RUNSC[@]}" "$@" 2>&1)
  status=$?
  if [[ $status -ne 0 && $output == *"not running"* ]]; then
    output="container not running: $output"
  fi
  [[ -n $output ]] && printf '%s\n' "$output" >&2
  exit "$status"
fi
exec "${RUNSC[@]}" "$@"
