#!/usr/bin/env bash
# Install the peers the benchmarks measure in the same run as vz (docs/benchmarks.md): Debian's docker.io and
# podman (B7, B4 peers: `docker exec` / `podman exec`) and iperf3 (B11). Not needed by the test suite: without
# them the benchmarks report the peer as not measured, with the reason. The benchmarks start private instances
# (own data roots and sockets, no host networking) and remove them afterwards; no system service is enabled here.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends docker.io podman iperf3
