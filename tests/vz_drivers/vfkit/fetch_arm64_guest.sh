#!/bin/sh
# Fetch the pieces of the arm64 vz guest that the arm64 boot test needs, from Debian's archive only, pinned by
# SHA-256: the bookworm arm64 kernel (an uncompressed ARM64 Image, as vfkit requires) with its modules, and a
# static arm64 busybox. Also needs qemu-system-aarch64 (Debian: qemu-system-arm).
#
#   sh tests/vz_drivers/vfkit/fetch_arm64_guest.sh [DIR]      (default DIR: ~/.cache/vz/arm64-guest)
#
# Debian drops superseded kernel builds from its mirrors: when the pinned version is gone, update the three
# pins below together (version, and the SHA-256 of each .deb) after checking the new packages.
set -eu

KERNEL_PKG=linux-image-6.1.0-57-arm64
KERNEL_VERSION=6.1.192-3
KERNEL_RELEASE=6.1.0-57-arm64
KERNEL_SHA256=8301bd5b5b2cf8fd5e479832200c23e64eca0ae9ec45c487c5c318b1e44d4692
BUSYBOX_VERSION=1:1.35.0-4+deb12u1+b1
BUSYBOX_SHA256=732c9135564fc71337e0e05fb4da4d11e6c28c1834bce3e405e575afef2a52f5

DIR=${1:-${HOME}/.cache/vz/arm64-guest}
mkdir -p "$DIR/debs"
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    dpkg --add-architecture arm64
    apt-get update -q
fi
command -v qemu-system-aarch64 >/dev/null || apt-get install -y -q qemu-system-arm
cd "$DIR/debs"
[ -f "${KERNEL_PKG}_${KERNEL_VERSION}_arm64.deb" ] || apt-get download -q "${KERNEL_PKG}:arm64=${KERNEL_VERSION}"
busybox_deb=$(ls busybox-static_*_arm64.deb 2>/dev/null | head -n 1 || true)
[ -n "$busybox_deb" ] || apt-get download -q "busybox-static:arm64=${BUSYBOX_VERSION}"
busybox_deb=$(ls busybox-static_*_arm64.deb | head -n 1)
echo "${KERNEL_SHA256}  ${KERNEL_PKG}_${KERNEL_VERSION}_arm64.deb" | sha256sum -c -
echo "${BUSYBOX_SHA256}  ${busybox_deb}" | sha256sum -c -
cd "$DIR"
rm -rf root.new
mkdir root.new
dpkg-deb -x "debs/${KERNEL_PKG}_${KERNEL_VERSION}_arm64.deb" root.new
dpkg-deb -x "debs/${busybox_deb}" root.new
depmod -b root.new "$KERNEL_RELEASE"   # the package's postinst would; the initramfs builder reads modules.dep
rm -rf root
mv root.new root
echo "arm64 guest parts in $DIR/root (kernel root/boot/vmlinuz-$KERNEL_RELEASE)"
