"""Old home of the linux_native record book (now ``vz_drivers._machine``)."""

# shim: removed in the import sweep
from vz_drivers._machine import machine_key as machine_key

__all__ = ["machine_key"]
