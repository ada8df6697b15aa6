"""Fixtures of the route-domain tests: made-up environment ids and test namespaces, with a leak check.

Everything is created by the tests and removed here; the inventory (``netns_kit.inventory``) compares the host's
namespaces, links and nft tables before and after, restricted to names these tests could have created.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator

import pytest
from netns_kit import Namespaces, inventory, ours, run


@pytest.fixture
def env_ids() -> list[str]:
    alphabet = "0123456789abcdefghjkmnpqrstvwxyz"
    return ["env_" + "".join(secrets.choice(alphabet) for _ in range(12)) for _ in range(2)]


@pytest.fixture
def namespaces(env_ids: list[str]) -> Iterator[Namespaces]:
    """Test namespaces; the route domains of ``env_ids`` removed too; nothing of ours left on the host."""
    if os.geteuid() != 0:
        pytest.fail("route-domain tests need root (they create network namespaces, veth pairs, nft tables)")
    tag = secrets.token_hex(2)
    domains = {"vzd-" + e[4:] for e in env_ids}
    before = ours(inventory(), tag, domains)
    spaces = Namespaces(tag)
    try:
        yield spaces
    finally:
        for full in list(spaces.created):
            with contextlib.suppress(RuntimeError):
                spaces.remove(full)
        left = sorted(d for d in domains if os.path.lexists(f"/run/netns/{d}"))
        for domain in left:
            with contextlib.suppress(RuntimeError):
                run("ip", "netns", "del", domain)
        if left:
            pytest.fail(f"the test left its route domains behind: {', '.join(left)}")
    after = ours(inventory(), tag, domains)
    assert after == before, f"leaked: { {k: after[k] - before[k] for k in after} }"
