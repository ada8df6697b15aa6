#!/usr/bin/env bash
# Fails when the test suite left vz processes, mounts, network namespaces, links, nft tables or cgroups behind.
# Usage: leak-check.sh snapshot FILE   (record what exists before the suite)
#        leak-check.sh [FILE]          (report what exists now and was not in FILE)
set -uo pipefail

inventory() {
  ps -eo pid,lstart,args | grep -E 'qemu-system|runc (run|exec|init)|vz-driver|vz-agent|vz_plugins|_supervise|docker-registry' \
    | grep -v -E 'grep|leak-check' | sed 's/^/process /'
  findmnt -rn -o TARGET | grep -E '^/tmp/|/vz[-_/]' | sed 's/^/mount /'
  if command -v ip >/dev/null; then
    ip netns list 2>/dev/null | grep -E '^vz' | sed 's/^/netns /'
    ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | grep -E '^vz' | sed 's/^/link /'
  fi
  if command -v nft >/dev/null; then
    nft list tables 2>/dev/null | awk '$3 ~ /^vz/ {print "nft " $2 " " $3}'
  fi
  find /sys/fs/cgroup -mindepth 2 -maxdepth 4 -type d -name 'vz-*' 2>/dev/null | sed 's/^/cgroup /'
}

if [ "${1:-}" = "snapshot" ]; then
  inventory | sort > "$2"
  exit 0
fi
before="${1:-/dev/null}"
now=$(inventory | sort)
new=$(comm -13 <(sort "$before") <(printf '%s\n' "$now" | sed '/^$/d'))
if [ -n "$new" ]; then
  echo "left behind by the test suite:"
  printf '%s\n' "$new"
  exit 1
fi
echo "nothing left behind"
