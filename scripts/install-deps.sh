#!/usr/bin/env bash
# Install what vz needs on Debian 12: system packages (apt-get) and a virtualenv with vz and its test tools.
# Usage: scripts/install-deps.sh            (as root, or with sudo available)
# Environment: VZ_VENV (default .venv), PYTHON (default python3), VZ_SKIP_APT=1 to skip apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  # Python toolchain for the virtualenv (Debian's python3 is 3.11 on Debian 12)
  python3 python3-venv python3-dev gcc
  # static C programs the security tests run inside Machines (tests/security/agent_probe: gcc -static)
  libc6-dev
  # linux_native: OCI runtime, network namespaces/egress rules, embedded default image
  runc iproute2 nftables busybox-static
  # linux_native: CRIU, probed for checkpointing containers (Extensions.save_state_reason says what it found)
  criu
  # the built-in image vz:developer (Debian 12 with a Docker engine), built from pinned packages
  mmdebstrap
  # images: local OCI registry for tests, image tools
  docker-registry skopeo umoci
  # qemu: VMs under TCG/KVM, root disks without loop devices, a stock guest kernel
  qemu-system-x86 e2fsprogs linux-image-amd64 kmod cpio
  # the shared Linux guest for other hosts, verified here: aarch64 under TCG (vfkit), an EFI disk under OVMF
  # and its VHDX (hyperv): firmware, disk tools, FAT without mounts, GPT, the EFI stub of a unified kernel image
  qemu-system-arm ovmf qemu-utils mtools dosfstools gdisk systemd-boot-efi binutils
  # the vfkit guest's DHCP network, verified here: tests run their own dnsmasq on a tap they create (the -base
  # package installs the program only, no service)
  dnsmasq-base
  # hyperv's workspace/mount shares, verified here: the guest mounts SMB 3.1.1 shares of a test-run smbd on loopback
  samba
  # interactive terminals: tests drive the real CLI in a real terminal
  tmux
  # guest agent build and Go interop fixtures (go-plugin peers), GOPATH mode
  golang-go golang-github-hashicorp-go-plugin-dev golang-google-grpc-dev golang-google-protobuf-dev
  golang-github-golang-protobuf-1-5-dev golang-google-genproto-dev golang-golang-x-sys-dev
  protobuf-compiler protoc-gen-go protoc-gen-go-grpc
  # misc used by tests
  procps psmisc util-linux
)

if [ "${VZ_SKIP_APT:-0}" != "1" ]; then
  SUDO=""
  if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing system packages: ${missing[*]}"
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
fi

# Guest bundles are built from pinned Debian packages fetched with `apt-get download` (vz_drivers/_guest/_bundle.py):
# the arm64 ones need the foreign architecture in apt's lists (nothing arm64 is installed).
if [ "${VZ_SKIP_APT:-0}" != "1" ] && [ "$(id -u)" = "0" ]; then
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    dpkg --add-architecture arm64
    apt-get update -q || echo "warning: apt-get update for arm64 failed; arm64 guest bundles cannot be built" >&2
  fi
fi

VENV="${VZ_VENV:-.venv}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e '.[test]'
# Bytecode for the editable sources, as pip writes it for a regular install: the CLI starts faster (Python reads
# existing .pyc files even where PYTHONDONTWRITEBYTECODE stops it from writing them).
"$VENV/bin/python" -m compileall -q -j 0 vz_core vz_drivers plugins/vz_plugins conformance/vz_conformance >/dev/null || true
# Go programs every test run needs, built once here (setup, not tests) and found by digest afterwards: the guest
# agent for this machine and for macOS guests (darwin/arm64) into Go's build cache (scripts/test.sh exports the
# same GOCACHE, so a test's fresh output directory only links), and the Go interop peers (tests/go/build.sh,
# shared by tests/interop and the benchmarks). A failure here is only a warning: the tests then build (or fail
# naming what is missing) themselves.
if command -v go >/dev/null 2>&1; then
  GOCACHE="${GOCACHE:-$(go env GOCACHE)}" "$VENV/bin/python" - <<'PY' || echo "warning: prebuilding the Go programs failed" >&2
import os

from vz_drivers.agent import ensure_agent_binary

os.environ.pop("VZ_AGENT_BINARY", None)
ensure_agent_binary()
ensure_agent_binary("arm64", goos="darwin")
from benchmarks._common import go_peer_bin

notes: list[str] = []
if go_peer_bin(notes) is None:
    print("warning: " + "; ".join(notes))
PY
fi
echo "vz installed in $VENV (activate with: . $VENV/bin/activate)"
