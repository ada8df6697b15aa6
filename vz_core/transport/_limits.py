"""The gRPC limits of every channel between a vz host and a plugin: the largest message either side accepts and
the channel and server options built from it (``vz_core.rpc`` re-exports them for its servers and its pair)."""

from __future__ import annotations

__all__ = ["CHANNEL_OPTIONS", "MAX_MESSAGE", "SERVER_OPTIONS"]

MAX_MESSAGE = 4 * 1024 * 1024
"""Bytes: the largest gRPC message a vz host or a vz plugin accepts (and sends)."""

CHANNEL_OPTIONS: list[tuple[str, int | str]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.enable_retries", 0),
]
"""Options of every host channel to a plugin."""
SERVER_OPTIONS: list[tuple[str, int | str]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.max_receive_message_length", MAX_MESSAGE),
]
"""Options of every plugin server."""
