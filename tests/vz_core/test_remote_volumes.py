"""Named volumes removed through a plugin: ``vz.machine.v1.MachineExtensions.DeleteVolume`` end to end.

A real grpc.aio server on a private Unix socket serves the fake driver; ``RemoteDriver.delete_volume`` is what
the Environment layer calls (``vz delete``, ``vz volume rm``) when every driver runs out of process.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from vz_conformance.fake import FakeDriver

from vz_core import Extensions
from vz_core.errors import FailedPreconditionError, InvalidArgumentError, UnsupportedError
from vz_core.rpc import connect_in_process


class VolumeDriver(FakeDriver):
    """The fake with a volume store: a directory per named volume; one in ``busy`` is still mounted."""

    def __init__(self, state: Path) -> None:
        super().__init__(state)
        self.volumes = state / "volumes"
        self.volumes.mkdir(parents=True, exist_ok=True)
        self.busy: set[str] = set()

    async def extensions(self) -> Extensions:
        ext = await super().extensions()
        return replace(ext, volume_removal=True)  # the optional operation, declared on the contract

    async def delete_volume(self, name: str) -> None:
        if not name:
            raise InvalidArgumentError("a volume name is required")
        if name in self.busy:
            raise FailedPreconditionError(f"volume {name!r} is still mounted by Machine 'm1'; delete it first")
        path = self.volumes / name
        if path.is_dir():
            (path / "data").unlink(missing_ok=True)
            path.rmdir()


async def test_delete_volume_removes_the_data_and_is_idempotent(tmp_path: Path) -> None:
    driver = VolumeDriver(tmp_path / "state")
    (driver.volumes / "vz-e1-m1-cache").mkdir()
    (driver.volumes / "vz-e1-m1-cache" / "data").write_text("x")
    async with connect_in_process(driver, name="vol") as remote:
        ext = await remote.extensions()
        assert ext is not None and ext.volume_removal  # advertised, as the driver declared it
        await remote.delete_volume("vz-e1-m1-cache")
        assert not (driver.volumes / "vz-e1-m1-cache").exists()
        await remote.delete_volume("vz-e1-m1-cache")  # already gone: success


async def test_delete_volume_errors_keep_their_kind(tmp_path: Path) -> None:
    driver = VolumeDriver(tmp_path / "state")
    (driver.volumes / "vz-e1-m1-db").mkdir()
    driver.busy.add("vz-e1-m1-db")
    async with connect_in_process(driver, name="vol") as remote:
        with pytest.raises(FailedPreconditionError, match="still mounted"):
            await remote.delete_volume("vz-e1-m1-db")
        assert (driver.volumes / "vz-e1-m1-db").is_dir()  # nothing removed
        with pytest.raises(InvalidArgumentError, match="name is required"):
            await remote.delete_volume("")


async def test_a_driver_without_volume_removal_is_unsupported(tmp_path: Path) -> None:
    async with connect_in_process(FakeDriver(tmp_path / "state"), name="plain") as remote:
        with pytest.raises(UnsupportedError, match="no volume-removal operation"):
            await remote.delete_volume("vz-e1-m1-cache")


def test_extensions_advertise_volume_removal_as_field_14() -> None:
    from google.protobuf.descriptor import FieldDescriptor as F

    from vz_core.rpc.pb import extensions_pb2 as ext_pb

    fields = {f.name: (f.number, f.type) for f in ext_pb.DESCRIPTOR.message_types_by_name["ExtensionsResponse"].fields}
    assert fields["volume_removal"] == (14, F.TYPE_BOOL)
    rpc = ext_pb.DESCRIPTOR.services_by_name["MachineExtensions"].methods_by_name["DeleteVolume"]
    assert (rpc.input_type.name, rpc.output_type.name, rpc.client_streaming, rpc.server_streaming) == (
        "DeleteVolumeRequest",
        "DeleteVolumeResponse",
        False,
        False,
    )
    assert {f.name: (f.number, f.type) for f in rpc.input_type.fields} == {"name": (1, F.TYPE_STRING)}


async def test_the_extensions_answer_says_whether_volume_removal_is_served(tmp_path: Path) -> None:
    from vz_core.rpc import serve_in_process
    from vz_core.rpc.pb import extensions_pb2 as ext_pb
    from vz_core.rpc.pb import extensions_pb2_grpc as ext_grpc

    for driver, served in ((VolumeDriver(tmp_path / "a"), True), (FakeDriver(tmp_path / "b"), False)):
        async with serve_in_process(driver) as channel:
            stub = ext_grpc.MachineExtensionsStub(channel)  # type: ignore[no-untyped-call]
            reply = await stub.Extensions(ext_pb.ExtensionsRequest(), timeout=10)
            assert reply.volume_removal is served
