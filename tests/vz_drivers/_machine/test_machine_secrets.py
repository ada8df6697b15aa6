"""SecretKeeper: a Machine's environment values between starts, in memory and the kernel keyring only."""

from __future__ import annotations

import secrets
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vz_core.secrets import SecretKeeper
from vz_drivers._machine import MachineRecord


def _read_elsewhere(root: Path, key: str, machine_id: str) -> str:
    """What a fresh process (a later `vz` command, a relaunched plugin) gets for the Machine."""
    code = textwrap.dedent(
        f"""
        import json
        from vz_core.secrets import SecretKeeper
        print(json.dumps(SecretKeeper({str(root)!r}).get({key!r}, {machine_id!r})))
        """
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_values_reach_a_later_process_and_are_gone_after_drop(tmp_path: Path) -> None:
    keeper = SecretKeeper(tmp_path)
    value = "canary-" + secrets.token_hex(8)
    key, mid = secrets.token_hex(16), secrets.token_hex(16)
    if not keeper.put(key, mid, {"TOKEN": value, "BIG": "x" * 70000}):
        pytest.skip("no kernel keyring for this user here (the values stay in this process only)")
    try:
        assert keeper.get(key, mid) == {"TOKEN": value, "BIG": "x" * 70000}
        assert value in _read_elsewhere(tmp_path, key, mid)
        # Another Machine id (a recreated Machine) or another state directory gets nothing.
        assert _read_elsewhere(tmp_path, key, secrets.token_hex(16)) == "null"
        assert _read_elsewhere(tmp_path / "other", key, mid) == "null"
    finally:
        keeper.drop(key, mid)
    assert keeper.get(key, mid) is None
    assert _read_elsewhere(tmp_path, key, mid) == "null"


def test_a_record_file_keeps_the_names_only() -> None:
    value = "canary-" + secrets.token_hex(8)
    record = MachineRecord(
        workspace_id="w",
        key="k",
        machine_id="m",
        created_at="",
        image_ref="i",
        image_digest="d",
        argv=[],
        environment={"TOKEN": value},
        image_env=[],
        working_dir="/",
        user="",
        developer_identity="root",
        labels={},
        mounts=[],
        cpus=0,
        memory_bytes=0,
        egress="allow",
    )
    data = record.to_json()
    assert value not in repr(data)
    assert data["environment_names"] == ["TOKEN"]
    again = MachineRecord.from_json(data)
    assert again.environment == {} and again.environment_names == ["TOKEN"]
