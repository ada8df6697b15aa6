#!/usr/bin/env bash
# Build the Go interop peers (a go-plugin plugin and a go-plugin host) from Debian's Go packages, offline,
# in GOPATH mode. Go stubs are generated from protocol/ with protoc-gen-go / protoc-gen-go-grpc.
# Usage: tests/go/build.sh OUT_DIR     -> OUT_DIR/bin/{vz-go-plugin,vz-go-host}
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="$(mkdir -p "$1" && cd "$1" && pwd)"
gopath="$out/gopath"
gen="$gopath/src/vz.dev/protocol"
mkdir -p "$gen" "$gopath/src" "$out/bin"
rm -rf "$gopath/src/vzinterop"
cp -r "$here/src/vzinterop" "$gopath/src/vzinterop"
protoc -I"$root/protocol" \
  --go_out="$gopath/src" --go_opt=paths=import \
  --go-grpc_out="$gopath/src" --go-grpc_opt=paths=import \
  devsy/runtime/v1/runtime.proto
export GO111MODULE=off GOPATH="$gopath:/usr/share/gocode" GOFLAGS=-mod=mod GOCACHE="$out/gocache" CGO_ENABLED=0
unset GOFLAGS
go build -o "$out/bin/vz-go-plugin" vzinterop/plugin
go build -o "$out/bin/vz-go-host" vzinterop/host
echo "$out/bin"
