#!/usr/bin/env bash
# Fails when the test suite left processes, mounts, network namespaces or cgroups of vz behind.
set -uo pipefail
bad=0
procs=$(ps -eo pid,args | grep -E 'qemu-system|runc (run|exec|init)|vz-driver|vz-agent|vz_plugins|docker-registry' | grep -v -E 'grep|leak-check' || true)
if [ -n "$procs" ]; then echo "processes left behind:"; echo "$procs"; bad=1; fi
mounts=$(findmnt -rn -o TARGET | grep -E '^/tmp/|/vz[-_/]' || true)
if [ -n "$mounts" ]; then echo "mounts left behind:"; echo "$mounts"; bad=1; fi
if command -v ip >/dev/null; then
  ns=$(ip netns list 2>/dev/null | grep -E '^vz' || true)
  if [ -n "$ns" ]; then echo "network namespaces left behind:"; echo "$ns"; bad=1; fi
fi
cg=$(find /sys/fs/cgroup -maxdepth 3 -type d -name 'vz*' 2>/dev/null | head -20 || true)
if [ -n "$cg" ]; then echo "cgroups left behind:"; echo "$cg"; bad=1; fi
[ $bad -eq 0 ] && echo "nothing left behind"
exit $bad
