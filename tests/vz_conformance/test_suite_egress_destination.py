"""The egress cases' test destination: a listener in a namespace the suite creates, and nothing left after it."""

from __future__ import annotations

import asyncio
import os

import pytest
from vz_conformance._netdest import destination

pytestmark = pytest.mark.root


def _namespace_exists(name: str) -> bool:
    return os.path.exists(f"/run/netns/{name}")


async def test_destination_receives_and_counts_then_disappears() -> None:
    if os.geteuid() != 0:
        pytest.fail("the egress test destination needs root (it creates a network namespace and a veth pair)")
    async with destination() as dest:
        before = dest.rx_packets()
        reader, writer = await asyncio.wait_for(asyncio.open_connection(dest.host, dest.port), 10)
        writer.write(b"vz-conformance\n")
        await writer.drain()
        writer.close()
        await writer.wait_closed()
        del reader
        for _ in range(100):
            if dest.received:
                break
            await asyncio.sleep(0.05)
        assert dest.received == [b"vz-conformance\n"]
        assert dest.rx_packets() > before
        namespace = dest.namespace
    assert not _namespace_exists(namespace)
