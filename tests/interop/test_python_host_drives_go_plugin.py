"""vz's host (RemoteDriver over the supervised launcher) drives a go-plugin Go plugin through a manifest."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest

from vz_core import ExecExit, ExecOutput, ExecSpec, RunImageRequest
from vz_core.drivers import ManifestStore, add_manifest, remote_driver
from vz_core.errors import AlreadyExistsError, NotFoundError, TrustError
from vz_core.registry import DriverRegistry
from vz_core.rpc import RemoteDriver

WS = "go plugin/../ü workspace"


def _install(go_bin: Path, tmp: Path, *, plaintext: bool) -> ManifestStore:
    driver_dir = tmp / "driver"
    driver_dir.mkdir()
    shutil.copy2(go_bin / "vz-go-plugin", driver_dir / "vz-go-plugin")
    digest = hashlib.sha256((driver_dir / "vz-go-plugin").read_bytes()).hexdigest()
    manifest = {
        "manifest_version": 1,
        "name": "go-reference",
        "version": "0.1.0",
        "api_version": "1.2",
        "binaries": {"linux/amd64": {"path": "vz-go-plugin", "sha256": digest.upper()}},
        "plaintext": plaintext,
    }
    (driver_dir / "manifest.json").write_text(json.dumps(manifest))
    store = ManifestStore(tmp / "manifests")
    add_manifest(driver_dir / "manifest.json", registry=DriverRegistry(), store=store)
    return store


async def _collect(driver: RemoteDriver, argv: tuple[str, ...], data: bytes) -> tuple[bytes, bytes, ExecExit, int]:
    async def stdin() -> AsyncIterator[bytes]:
        for i in range(0, len(data), 100_000):
            yield data[i : i + 100_000]

    out, err, exit_, biggest = bytearray(), bytearray(), None, 0
    async for event in driver.exec(ExecSpec(WS, argv), stdin()):
        assert exit_ is None, "a frame arrived after the exit"
        if isinstance(event, ExecOutput):
            biggest = max(biggest, len(event.data))
            (out if event.stream == "stdout" else err).extend(event.data)
        else:
            exit_ = event
    assert exit_ is not None, "the stream ended without an exit"
    return bytes(out), bytes(err), exit_, biggest


@pytest.mark.parametrize("plaintext", [False, True], ids=["automtls-p521", "plaintext-by-manifest"])
async def test_our_host_drives_the_go_plugin(go_bin: Path, tmp_path: Path, plaintext: bool) -> None:
    store = _install(go_bin, tmp_path, plaintext=plaintext)
    driver = remote_driver("go-reference", store=store)
    try:
        info = await driver.info(supports_recreate_on_run=True)
        assert (info.driver_name, info.api_major, info.api_minor) == ("go-reference", 1, 2)
        conn = driver.connection
        assert conn is not None
        # A Go plugin's AutoMTLS certificate is ECDSA P-521, which grpcio cannot verify: the relay carries it.
        assert conn.tls == ("plaintext" if plaintext else "relay"), f"unexpected TLS mode {conn.tls!r}"

        assert await driver.find(WS) is None
        await driver.run_image(RunImageRequest(WS, "vz:default", labels=("a=b=c",)))
        details = await driver.find(WS)
        assert details is not None and details.state.status == "running" and details.config.labels == {"a": "b=c"}
        with pytest.raises(AlreadyExistsError):
            await driver.run_image(RunImageRequest(WS, "vz:default"))

        payload = bytes([0x00, 0xFF, 0x80, 0x0A, 0x0D, 0x01])
        out, _, exit_, _ = await _collect(driver, ("cat",), payload)
        assert out == payload and exit_.success

        big = bytes((i * 7) & 0xFF for i in range(1 << 20))
        out, _, exit_, biggest = await _collect(driver, ("cat",), big)
        assert hashlib.sha256(out).digest() == hashlib.sha256(big).digest() and exit_.success
        assert biggest <= 32768

        _, err, exit_, _ = await _collect(driver, ("sh", "-c", "echo oops >&2; exit 3"), b"")
        assert exit_.exit_code == 3 and b"oops" in err and not exit_.success

        await driver.stop(WS)
        assert (await driver.find(WS)).state.status == "stopped"  # type: ignore[union-attr]
        await driver.start(WS)
        assert (await driver.find(WS)).state.status == "running"  # type: ignore[union-attr]
        await driver.delete(WS)
        assert await driver.find(WS) is None

        with pytest.raises(NotFoundError) as missing:
            await driver.start(WS + "-missing")
        assert missing.value.message and missing.value.details.get("rpc") == "Start"

        pid = conn.pid
    finally:
        started = time.monotonic()
        await driver.close()
        closed_in = time.monotonic() - started
    # The Go plugin answers Shutdown with UNAVAILABLE (it stops inside the call): that counts as success, and
    # the process must be gone without waiting out go-plugin's 2 s grace.
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert closed_in < 2.0, f"closing took {closed_in:.2f}s"


async def test_a_changed_go_binary_is_refused_before_the_next_launch(go_bin: Path, tmp_path: Path) -> None:
    store = _install(go_bin, tmp_path, plaintext=False)
    driver = remote_driver("go-reference", store=store, mode="per_operation")
    try:
        assert await driver.find("x") is None
        binary = tmp_path / "driver" / "vz-go-plugin"
        with binary.open("ab") as f:
            f.write(b"\0")
        with pytest.raises(TrustError, match="SHA-256"):
            await driver.find("x")
    finally:
        await driver.close()


async def test_short_execs_against_a_go_server_that_ends_right_after_exit(go_bin: Path, tmp_path: Path) -> None:
    """A go-plugin server ends the call right after the exit frame, while our client may still be half-closing;
    grpcio then reports a made-up INTERNAL (grpc/grpc#36066). With the exit received, that is success."""
    store = _install(go_bin, tmp_path, plaintext=True)
    driver = remote_driver("go-reference", store=store)
    try:
        await driver.run_image(RunImageRequest(WS, "vz:default"))
        for _ in range(400):
            _, _, exit_, _ = await _collect(driver, ("true",), b"")
            assert exit_.success
        await driver.delete(WS)
    finally:
        await driver.close()
