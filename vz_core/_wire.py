"""Moved to ``vz_core.rpc`` (the wire-error helpers)."""

# shim: removed in the import sweep
from vz_core.rpc import DETAILS_TRAILER as DETAILS_TRAILER
from vz_core.rpc import RUNTIME_ERROR_TYPE_URL as RUNTIME_ERROR_TYPE_URL
from vz_core.rpc import error_from_rpc as error_from_rpc
from vz_core.rpc import error_to_runtime_error as error_to_runtime_error
from vz_core.rpc import error_to_status as error_to_status
from vz_core.rpc import runtime_errors_in as runtime_errors_in
