#!/usr/bin/env bash
# The whole test suite: lint, format, types, then pytest (warnings are errors). Exit 5 (no tests) fails.
# Usage: scripts/test.sh [pytest args...]
set -uo pipefail
cd "$(dirname "$0")/.."
VENV="${VZ_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then bash scripts/install-deps.sh || exit 1; fi
export PATH="$PWD/$VENV/bin:$PATH"
# One Go build cache for every guest agent build of the run (vz_drivers/_agent/_build.py uses an absolute
# $GOCACHE): a test that gives vz a fresh VZ_HOME then links the agent instead of compiling every package again.
if [ -z "${GOCACHE:-}" ] && command -v go >/dev/null 2>&1; then
  GOCACHE="$(go env GOCACHE)" && export GOCACHE
fi

status=0
leaks_before=$(mktemp)
bash scripts/leak-check.sh snapshot "$leaks_before"
echo "== ruff check"; ruff check . || status=1
echo "== ruff format --check"; ruff format --check . || status=1
echo "== mypy --strict (vz_core, drivers, plugin SDK, conformance, benchmarks, example driver, API examples)"; mypy vz_core vz_drivers plugins/vz_plugins conformance/vz_conformance benchmarks examples/drivers/hostdir/src/vz_driver_hostdir examples/drivers/hostdir/make_manifest.py examples/api || status=1
# Each host's code is type-checked for that host (vz_core.platform branches on sys.platform the way mypy reads it).
# macOS: everything that runs on a Mac (CLI, daemon, API client, transport, trust, SDK, the shared agent-Machine
# layer, the image store, the guest agent's host side, vfkit, macos_vm, qemu, the conformance suite); linux_native
# is Linux-only and not in the set. Windows: the platform layer, so far (docs/architecture.md, "The platform layer").
echo "== mypy --strict --platform darwin (the macOS host program)"; mypy --platform darwin vz_core vz_drivers/__init__.py vz_drivers/_lazy.py vz_drivers/_machine vz_drivers/_agent vz_drivers/_images vz_drivers/_guest vz_drivers/qemu vz_drivers/vfkit vz_drivers/macos_vm plugins/vz_plugins conformance/vz_conformance || status=1
# vz_core/network (route domains) is Linux-only: never imported on Windows, so not type-checked for it. Not yet
# at zero for win32 (docs/architecture.md): qemu, the plugin SDK's terminal, the conformance suite.
echo "== mypy --strict --platform win32 (the Windows host program: vz_core but route domains, the Machine layer, hyperv)"; mypy --platform win32 --exclude '^vz_core/(network|_proto)/' vz_core vz_drivers/__init__.py vz_drivers/_lazy.py vz_drivers/_machine vz_drivers/_agent vz_drivers/_guest vz_drivers/_images vz_drivers/hyperv || status=1
# Most tests wait (on guests, plugins, subprocesses) rather than compute, so the suite runs on several worker
# processes (pytest-xdist, one module per worker at a time: module fixtures such as a booted guest stay shared),
# in collection order (tests/conftest.py puts the longest modules first; xdist would otherwise start the modules
# with the most tests first).
# VZ_TEST_WORKERS=0 runs everything in this process. Tests marked host_exclusive change or compare host-wide
# state (IPv4 forwarding, the host's nft tables) and run afterwards, alone.
WORKERS="${VZ_TEST_WORKERS:-3}"
echo "== pytest ($WORKERS workers; host_exclusive tests afterwards, alone)"
python -m pytest --durations=25 -n "$WORKERS" --dist loadscope --no-loadscope-reorder -m "not host_exclusive" "$@"
rc=$?
echo "== pytest (host_exclusive)"
python -m pytest --durations=5 -m host_exclusive "$@"
rc_exclusive=$?
if [ "$rc" -eq 5 ] && [ "$rc_exclusive" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure" >&2
  status=1
fi
for code in "$rc" "$rc_exclusive"; do
  if [ "$code" -ne 0 ] && [ "$code" -ne 5 ]; then status=1; fi
done
echo "== leftovers"
bash scripts/leak-check.sh "$leaks_before" || status=1
rm -f "$leaks_before"
exit $status
