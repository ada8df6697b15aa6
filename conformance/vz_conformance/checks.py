"""Every check function of the catalogue, by label: ``async def check_x(ctx: CheckContext) -> Outcome``.

Each raises ``AssertionError`` naming the RPC, the frame, what was expected and what happened. Use them
directly (with a ``CheckContext``) or through ``run_suite`` / the pytest plugin, which also clean up.
"""

from __future__ import annotations

from vz_conformance._checks.cancel import check_blocked_stdin as check_cancel_blocked_stdin
from vz_conformance._checks.cancel import check_cancelled as check_cancel_cancelled
from vz_conformance._checks.cancel import check_deadline as check_cancel_deadline
from vz_conformance._checks.checkpoint import check_corrupt_refused as check_checkpoint_corrupt_refused
from vz_conformance._checks.checkpoint import check_delete_removes_state as check_checkpoint_delete_removes_state
from vz_conformance._checks.checkpoint import check_resume_keeps_process as check_checkpoint_resume_keeps_process
from vz_conformance._checks.crash import check_after_handshake as check_crash_after_handshake
from vz_conformance._checks.crash import check_before_handshake as check_crash_before_handshake
from vz_conformance._checks.crash import check_checksum_changed as check_crash_checksum_changed
from vz_conformance._checks.crash import check_during_info as check_crash_during_info
from vz_conformance._checks.crash import check_incompatible_version as check_crash_incompatible_version
from vz_conformance._checks.crash import check_malformed_info as check_crash_malformed_info
from vz_conformance._checks.crash import check_mid_exec as check_crash_mid_exec
from vz_conformance._checks.crash import check_never_handshake as check_crash_never_handshake
from vz_conformance._checks.crash import check_unknown_enum_info as check_crash_unknown_enum_info
from vz_conformance._checks.discovery import check_info_valid as check_discovery_info_valid
from vz_conformance._checks.discovery import check_preflight as check_discovery_preflight
from vz_conformance._checks.discovery import check_provisioning_preflight as check_discovery_provisioning_preflight
from vz_conformance._checks.discovery import check_target_architecture as check_discovery_target_architecture
from vz_conformance._checks.egress import check_default_reaches as check_egress_default_reaches
from vz_conformance._checks.egress import check_deny_holds as check_egress_deny_holds
from vz_conformance._checks.egress import check_deny_refuses as check_egress_deny_refuses
from vz_conformance._checks.exec import check_argv_verbatim as check_exec_argv_verbatim
from vz_conformance._checks.exec import check_binary_roundtrip as check_exec_binary_roundtrip
from vz_conformance._checks.exec import check_duplex_backpressure as check_exec_duplex_backpressure
from vz_conformance._checks.exec import check_early_exit as check_exec_early_exit
from vz_conformance._checks.exec import check_empty_stdin as check_exec_empty_stdin
from vz_conformance._checks.exec import check_environment as check_exec_environment
from vz_conformance._checks.exec import check_nonzero_exit as check_exec_nonzero_exit
from vz_conformance._checks.exec import check_output_frames as check_exec_output_frames
from vz_conformance._checks.exec import check_shell_command as check_exec_shell_command
from vz_conformance._checks.exec import check_signal_exit as check_exec_signal_exit
from vz_conformance._checks.exec import check_stdin_to_stderr as check_exec_stdin_to_stderr
from vz_conformance._checks.exec import check_user as check_exec_user
from vz_conformance._checks.exec import check_workdir as check_exec_workdir
from vz_conformance._checks.identity import check_reuse_cancelled as check_identity_reuse_cancelled
from vz_conformance._checks.identity import check_reuse_changed as check_identity_reuse_changed
from vz_conformance._checks.identity import check_reuse_missing as check_identity_reuse_missing
from vz_conformance._checks.identity import check_reuse_same as check_identity_reuse_same
from vz_conformance._checks.identity import check_workspace_owner as check_identity_workspace_owner
from vz_conformance._checks.lifecycle import check_already_exists as check_lifecycle_already_exists
from vz_conformance._checks.lifecycle import check_delete_idempotent as check_lifecycle_delete_idempotent
from vz_conformance._checks.lifecycle import check_empty_arguments as check_lifecycle_empty_arguments
from vz_conformance._checks.lifecycle import check_find_absent as check_lifecycle_find_absent
from vz_conformance._checks.lifecycle import check_missing_not_found as check_lifecycle_missing_not_found
from vz_conformance._checks.lifecycle import check_odd_ids as check_lifecycle_odd_ids
from vz_conformance._checks.lifecycle import check_run_find_running as check_lifecycle_run_find_running
from vz_conformance._checks.lifecycle import check_start_idempotent as check_lifecycle_start_idempotent
from vz_conformance._checks.lifecycle import check_stop_idempotent as check_lifecycle_stop_idempotent
from vz_conformance._checks.lifecycle import check_stopped_exec_refused as check_lifecycle_stopped_exec_refused
from vz_conformance._checks.local_exec import check_local_cancelled as check_exec_local_cancelled
from vz_conformance._checks.local_exec import check_local_exit_code as check_exec_local_exit_code
from vz_conformance._checks.local_exec import check_local_file_to_file as check_exec_local_file_to_file
from vz_conformance._checks.local_exec import check_local_frames as check_exec_local_frames
from vz_conformance._checks.local_exec import check_local_missing_not_found as check_exec_local_missing_not_found
from vz_conformance._checks.local_exec import check_local_pipe_to_pipe as check_exec_local_pipe_to_pipe
from vz_conformance._checks.local_exec import check_local_signal_exit as check_exec_local_signal_exit
from vz_conformance._checks.local_exec import check_local_stopped_refused as check_exec_local_stopped_refused
from vz_conformance._checks.local_exec import check_local_terminal_refused as check_exec_local_terminal_refused
from vz_conformance._checks.logs import check_chunk_sizes as check_logs_chunk_sizes
from vz_conformance._checks.logs import check_kept_after_stop as check_logs_kept_after_stop
from vz_conformance._checks.logs import check_merged_exact as check_logs_merged_exact
from vz_conformance._checks.malformed import check_data_after_close as check_malformed_data_after_close
from vz_conformance._checks.malformed import check_empty_argv as check_malformed_empty_argv
from vz_conformance._checks.malformed import check_empty_data_frame as check_malformed_empty_data_frame
from vz_conformance._checks.malformed import check_eof_before_close as check_malformed_eof_before_close
from vz_conformance._checks.malformed import check_missing_start as check_malformed_missing_start
from vz_conformance._checks.malformed import check_second_start as check_malformed_second_start
from vz_conformance._checks.malformed import check_tty as check_malformed_tty
from vz_conformance._checks.malformed import check_unset_payload as check_malformed_unset_payload
from vz_conformance._checks.mounts import check_bind_read_only as check_mounts_bind_read_only
from vz_conformance._checks.mounts import check_bind_read_write as check_mounts_bind_read_write
from vz_conformance._checks.mounts import check_tmpfs_reset as check_mounts_tmpfs_reset
from vz_conformance._checks.mounts import check_unsupported_type as check_mounts_unsupported_type
from vz_conformance._checks.mounts import check_volume_persists as check_mounts_volume_persists
from vz_conformance._checks.network import check_after_restart as check_network_after_restart
from vz_conformance._checks.network import check_allowlist_cidr as check_network_allowlist_cidr
from vz_conformance._checks.network import check_allowlist_domain as check_network_allowlist_domain
from vz_conformance._checks.network import check_cross_environment as check_network_cross_environment
from vz_conformance._checks.network import check_dns as check_network_dns
from vz_conformance._checks.network import check_export as check_network_export
from vz_conformance._checks.network import check_import as check_network_import
from vz_conformance._checks.network import check_offline as check_network_offline
from vz_conformance._checks.network import check_paths as check_network_paths
from vz_conformance._checks.pty import check_bulk_output as check_pty_bulk_output
from vz_conformance._checks.pty import check_cancel as check_pty_cancel
from vz_conformance._checks.pty import check_ctrl_c as check_pty_ctrl_c
from vz_conformance._checks.pty import check_echo as check_pty_echo
from vz_conformance._checks.pty import check_eof as check_pty_eof
from vz_conformance._checks.pty import check_exit_code as check_pty_exit_code
from vz_conformance._checks.pty import check_resize as check_pty_resize
from vz_conformance._checks.pty import check_size as check_pty_size
from vz_conformance._checks.recreate import check_invalid_keeps_running as check_recreate_invalid_keeps_running
from vz_conformance._checks.recreate import check_invalid_keeps_stopped as check_recreate_invalid_keeps_stopped
from vz_conformance._checks.recreate import check_opt_in as check_recreate_opt_in
from vz_conformance._checks.recreate import check_valid_replaces as check_recreate_valid_replaces
from vz_conformance._checks.resources import check_impossible_refused as check_resources_impossible_refused
from vz_conformance._checks.resources import check_visible as check_resources_visible
from vz_conformance._checks.services import check_health_and_order as check_services_health_and_order
from vz_conformance._checks.services import check_restart_policies as check_services_restart_policies
from vz_conformance._checks.services import check_supervised as check_services_supervised
from vz_conformance._checks.storage import check_local_gone_after_recreate as check_storage_local_gone_after_recreate
from vz_conformance._checks.storage import check_local_survives_restart as check_storage_local_survives_restart
from vz_conformance._checks.storage import check_size as check_storage_size
from vz_conformance._checks.storage import check_workspace_survives as check_storage_workspace_survives

__all__ = [
    "check_cancel_blocked_stdin",
    "check_cancel_cancelled",
    "check_cancel_deadline",
    "check_checkpoint_corrupt_refused",
    "check_checkpoint_delete_removes_state",
    "check_checkpoint_resume_keeps_process",
    "check_crash_after_handshake",
    "check_crash_before_handshake",
    "check_crash_checksum_changed",
    "check_crash_during_info",
    "check_crash_incompatible_version",
    "check_crash_malformed_info",
    "check_crash_mid_exec",
    "check_crash_never_handshake",
    "check_crash_unknown_enum_info",
    "check_discovery_info_valid",
    "check_discovery_preflight",
    "check_discovery_provisioning_preflight",
    "check_discovery_target_architecture",
    "check_egress_default_reaches",
    "check_egress_deny_holds",
    "check_egress_deny_refuses",
    "check_exec_argv_verbatim",
    "check_exec_binary_roundtrip",
    "check_exec_duplex_backpressure",
    "check_exec_early_exit",
    "check_exec_empty_stdin",
    "check_exec_environment",
    "check_exec_local_cancelled",
    "check_exec_local_exit_code",
    "check_exec_local_file_to_file",
    "check_exec_local_frames",
    "check_exec_local_missing_not_found",
    "check_exec_local_pipe_to_pipe",
    "check_exec_local_signal_exit",
    "check_exec_local_stopped_refused",
    "check_exec_local_terminal_refused",
    "check_exec_nonzero_exit",
    "check_exec_output_frames",
    "check_exec_shell_command",
    "check_exec_signal_exit",
    "check_exec_stdin_to_stderr",
    "check_exec_user",
    "check_exec_workdir",
    "check_identity_reuse_cancelled",
    "check_identity_reuse_changed",
    "check_identity_reuse_missing",
    "check_identity_reuse_same",
    "check_identity_workspace_owner",
    "check_lifecycle_already_exists",
    "check_lifecycle_delete_idempotent",
    "check_lifecycle_empty_arguments",
    "check_lifecycle_find_absent",
    "check_lifecycle_missing_not_found",
    "check_lifecycle_odd_ids",
    "check_lifecycle_run_find_running",
    "check_lifecycle_start_idempotent",
    "check_lifecycle_stop_idempotent",
    "check_lifecycle_stopped_exec_refused",
    "check_logs_chunk_sizes",
    "check_logs_kept_after_stop",
    "check_logs_merged_exact",
    "check_malformed_data_after_close",
    "check_malformed_empty_argv",
    "check_malformed_empty_data_frame",
    "check_malformed_eof_before_close",
    "check_malformed_missing_start",
    "check_malformed_second_start",
    "check_malformed_tty",
    "check_malformed_unset_payload",
    "check_mounts_bind_read_only",
    "check_mounts_bind_read_write",
    "check_mounts_tmpfs_reset",
    "check_mounts_unsupported_type",
    "check_mounts_volume_persists",
    "check_network_after_restart",
    "check_network_allowlist_cidr",
    "check_network_allowlist_domain",
    "check_network_cross_environment",
    "check_network_dns",
    "check_network_export",
    "check_network_import",
    "check_network_offline",
    "check_network_paths",
    "check_pty_bulk_output",
    "check_pty_cancel",
    "check_pty_ctrl_c",
    "check_pty_echo",
    "check_pty_eof",
    "check_pty_exit_code",
    "check_pty_resize",
    "check_pty_size",
    "check_recreate_invalid_keeps_running",
    "check_recreate_invalid_keeps_stopped",
    "check_recreate_opt_in",
    "check_recreate_valid_replaces",
    "check_resources_impossible_refused",
    "check_resources_visible",
    "check_services_health_and_order",
    "check_services_restart_policies",
    "check_services_supervised",
    "check_storage_local_gone_after_recreate",
    "check_storage_local_survives_restart",
    "check_storage_size",
    "check_storage_workspace_survives",
]
