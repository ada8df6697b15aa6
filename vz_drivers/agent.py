"""The vz guest agent for code outside vz_drivers (benchmarks, tools): the binary and its host-side client.

Pure re-exports of ``vz_drivers._agent``; see docs/agent-protocol.md.
"""

from __future__ import annotations

from vz_drivers._agent import AgentClient, AgentInfo, AgentStatus, agent_source_digest, ensure_agent_binary

__all__ = ["AgentClient", "AgentInfo", "AgentStatus", "agent_source_digest", "ensure_agent_binary"]
