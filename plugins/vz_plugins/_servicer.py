"""Moved to ``vz_core.rpc`` (``RuntimeServicer``, ``ExtensionsServicer``)."""

# shim: removed in the import sweep
from vz_core.rpc import ExtensionsServicer as ExtensionsServicer
from vz_core.rpc import RuntimeServicer as RuntimeServicer
