"""Moved to ``vz_core.rpc`` (``RemoteDriver``, ``Mode``)."""

# shim: removed in the import sweep
from vz_core.rpc import Mode as Mode
from vz_core.rpc import RemoteDriver as RemoteDriver

__all__ = ["Mode", "RemoteDriver"]
