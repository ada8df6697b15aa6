"""Moved to ``vz_core.rpc`` (the conversion helpers)."""

# shim: removed in the import sweep
from vz_core.rpc import capabilities_from_pb as capabilities_from_pb
from vz_core.rpc import capabilities_to_pb as capabilities_to_pb
from vz_core.rpc import details_from_pb as details_from_pb
from vz_core.rpc import details_to_pb as details_to_pb
from vz_core.rpc import exec_event_from_pb as exec_event_from_pb
from vz_core.rpc import exec_event_to_pb as exec_event_to_pb
from vz_core.rpc import exec_spec_from_pb as exec_spec_from_pb
from vz_core.rpc import exec_spec_to_pb as exec_spec_to_pb
from vz_core.rpc import extensions_from_pb as extensions_from_pb
from vz_core.rpc import extensions_to_pb as extensions_to_pb
from vz_core.rpc import info_from_pb as info_from_pb
from vz_core.rpc import info_to_pb as info_to_pb
from vz_core.rpc import mount_from_pb as mount_from_pb
from vz_core.rpc import mount_to_pb as mount_to_pb
from vz_core.rpc import run_image_from_pb as run_image_from_pb
from vz_core.rpc import run_image_to_pb as run_image_to_pb
