"""The vz guest agent: a static Go binary running inside a Machine, and its asyncio host-side client.

``vz-agent`` executes commands for the host over one multiplexed byte stream (a Unix socket per connection,
or a single virtio-serial port); the wire protocol is described in docs/agent-protocol.md. Drivers call
``ensure_agent_binary()`` to get the binary (built from the bundled Go sources at first use) and talk to a
running agent through ``AgentClient``, whose ``exec`` has ``vz_core.Driver.exec`` semantics.
"""

from __future__ import annotations

from vz_drivers._agent._build import agent_source_digest, agent_source_dir, ensure_agent_binary
from vz_drivers._agent._client import AgentClient, AgentIdentityError, AgentInfo, AgentStatus, identity_proof

__all__ = [
    "AgentClient",
    "AgentIdentityError",
    "AgentInfo",
    "AgentStatus",
    "agent_source_digest",
    "agent_source_dir",
    "ensure_agent_binary",
    "identity_proof",
]
