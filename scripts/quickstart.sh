#!/usr/bin/env bash
# Set everything up on Debian 12 and run the main job on the embedded default example:
# `vz up` then `vz exec` in examples/default (a version 2 vz.json: linux_native driver, image vz:default: nothing
# to download; egress offline, the version 2 default).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
VENV="${VZ_VENV:-.venv}"
export PATH="$PWD/$VENV/bin:$PATH"
cd examples/default
vz up
vz exec -- sh -c 'echo "hello from $(hostname): $(uname -sm)"; ls /workspace'
vz status
echo
echo "The Machine keeps running. Try an interactive shell: (cd examples/default && vz exec -it -- sh) ; remove it with: (cd examples/default && vz delete)"
