"""The vfkit guest: the shared vz Linux guest (``vz_drivers._guest``) with vfkit's transports.

The guest is the vz Linux guest (kernel + initramfs with the agent as init) built for the host's architecture.
Its init reads ``config.sh`` from the virtio-fs share named by ``vz.cfg=vzcfg`` on the kernel command line: the
shared renderer with ``virtiofs=True`` (``vz_virtiofs TAG TARGET ro|rw``: read-only is the guest's ``-o ro``,
the host shares read-write) and ``vsock=(1024, 1025)`` (``vz_agent_vsock``: the agent serves AF_VSOCK port 1024
and reports ready on host port 1025). The script holds the Machine's environment (secrets): it is written 0600
into the Machine's private directory and never appears on vfkit's command line.
"""

from __future__ import annotations

__all__ = ["GUEST_MODULES"]

GUEST_MODULES: tuple[str, ...] = (
    "virtio_pci",
    "virtio_mmio",
    "virtio_console",  # hvc0: vfkit's virtio-serial console
    "virtio_blk",  # the raw root disk
    "virtio_net",
    "crc32c_generic",  # ext4/jbd2 checksums ask the crypto layer for "crc32c" at mount time
    "ext4",
    "virtiofs",  # the configuration share, the workspace, bind mounts, volumes, Rosetta
    "vmw_vsock_virtio_transport",  # the agent and the readiness report
)
"""Kernel modules the vfkit guest's initramfs loads (when not built in), by module name."""
