"""Pinned bases: the shipped descriptor and its schema, channel and id resolution, the unpinned policy."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from vz_core.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError, UnavailableError
from vz_drivers.macos_vm._bases import (
    BasesFile,
    PinPolicy,
    load_bases,
    resolve_base,
    schema_text,
    sha256_file,
    shipped_bases_path,
)

SHA_A = hashlib.sha256(b"a").hexdigest()
SHA_B = hashlib.sha256(b"b").hexdigest()
SHA_C = hashlib.sha256(b"c").hexdigest()


def _descriptor(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "schema_version": 1,
        "bases": {
            "macos-15.1-24B83": {
                "version": "15.1",
                "build": "24B83",
                "sha256": SHA_A,
                "size": 15_000_000_000,
                "url": "https://updates.example.test/UniversalMac_15.1_24B83_Restore.ipsw",
            },
            "macos-14.7-23H124": {
                "version": "14.7",
                "build": "23H124",
                "sha256": SHA_B,
                "size": 14_000_000_000,
                "url": "https://updates.example.test/UniversalMac_14.7_23H124_Restore.ipsw",
            },
            "macos-14.6-23G80": {
                "version": "14.6",
                "build": "23G80",
                "sha256": SHA_C,
                "size": 14_000_000_000,
                "url": "https://updates.example.test/UniversalMac_14.6_23G80_Restore.ipsw",
                "status": "retired",
                "replacement": "macos-14.7-23H124",
                "retired_because": "superseded by a security update",
            },
        },
        "channels": {"stable": "macos-15.1-24B83", "previous": "macos-14.7-23H124"},
    }
    data.update(changes)
    return data


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "bases.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def bases(tmp_path: Path) -> BasesFile:
    return load_bases(_write(tmp_path, _descriptor()))


def test_the_shipped_descriptor_is_valid_and_its_schema_file_is_current() -> None:
    shipped = load_bases()
    assert set(shipped.channels) == {"stable", "previous"}
    schema_file = shipped_bases_path().with_name("bases.schema.json")
    assert schema_file.read_text() == schema_text(), "regenerate bases.schema.json from BasesFile"
    schema = json.loads(schema_file.read_text())
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {"schema_version", "bases", "channels"}


def test_a_descriptor_field_out_of_shape_is_named(tmp_path: Path) -> None:
    bad = _descriptor()
    bad["bases"]["macos-15.1-24B83"]["sha256"] = "ABC"
    with pytest.raises(UnavailableError, match=r"bases\.macos-15\.1-24B83\.sha256"):
        load_bases(_write(tmp_path, bad))


def test_channels_and_ids_resolve_to_pinned_bases(bases: BasesFile) -> None:
    stable = resolve_base("macos:stable", bases, PinPolicy(), env={})
    assert (stable.base_id, stable.sha256, stable.build, stable.pinned) == ("macos-15.1-24B83", SHA_A, "24B83", True)
    assert stable.source.startswith("https://")
    previous = resolve_base("macos:previous", bases, PinPolicy(), env={})
    assert previous.base_id == "macos-14.7-23H124"
    by_id = resolve_base("macos:macos-14.7-23H124", bases, PinPolicy(), env={})
    assert by_id == previous


def test_a_retired_base_names_its_replacement(bases: BasesFile) -> None:
    with pytest.raises(FailedPreconditionError) as info:
        resolve_base("macos:macos-14.6-23G80", bases, PinPolicy(), env={})
    assert "retired (superseded by a security update)" in info.value.message
    assert "use macos:macos-14.7-23H124 instead" in info.value.message
    assert info.value.details["replacement"] == "macos-14.7-23H124"


def test_an_unknown_base_lists_the_known_ones(bases: BasesFile) -> None:
    with pytest.raises(NotFoundError) as info:
        resolve_base("macos:macos-16.0-25A1", bases, PinPolicy(), env={})
    assert "macos-14.7-23H124, macos-15.1-24B83" in info.value.message
    assert "macos-14.6-23G80" not in info.value.message  # retired ones are not offered


def test_a_channel_without_a_pin_says_how_to_pin(tmp_path: Path) -> None:
    empty = load_bases(
        _write(tmp_path, {"schema_version": 1, "bases": {}, "channels": {"stable": None, "previous": None}})
    )
    with pytest.raises(FailedPreconditionError, match=r"no base pinned.*ipsw:<path>@sha256"):
        resolve_base("macos:stable", empty, PinPolicy(), env={})


def test_local_restore_images_pinned_by_digest_are_accepted(bases: BasesFile) -> None:
    base = resolve_base(f"ipsw:/images/Restore.ipsw@sha256:{SHA_A.upper()}", bases, PinPolicy(), env={"CI": "true"})
    assert (base.pinned, base.sha256, base.source) == (True, SHA_A, "/images/Restore.ipsw")
    assert base.base_id == "sha256-" + SHA_A[:32]


@pytest.mark.parametrize("image", ["ipsw:/images/Restore.ipsw", "macos:latest"])
def test_unpinned_images_need_the_host_option_and_more_in_ci(bases: BasesFile, image: str) -> None:
    with pytest.raises(FailedPreconditionError, match="allow_unpinned=true"):
        resolve_base(image, bases, PinPolicy(), env={})
    allowed = resolve_base(image, bases, PinPolicy(allow_unpinned=True), env={"CI": "false"})
    assert allowed.pinned is False and allowed.sha256 == ""
    with pytest.raises(FailedPreconditionError, match="CI=true"):
        resolve_base(image, bases, PinPolicy(allow_unpinned=True), env={"CI": "true"})
    in_ci = resolve_base(image, bases, PinPolicy(allow_unpinned=True, allow_unpinned_in_ci=True), env={"CI": "true"})
    assert in_ci == allowed


@pytest.mark.parametrize(
    "image", ["vz:default", "ubuntu:24.04", "ipsw:relative.ipsw", "ipsw:/x/Restore.dmg", "ipsw:/x.ipsw@sha256:12"]
)
def test_other_references_are_invalid(bases: BasesFile, image: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        resolve_base(image, bases, PinPolicy(allow_unpinned=True), env={})
    assert info.value.details["field"] == "image"


@pytest.mark.parametrize(
    ("change", "text"),
    [
        ({"channels": {"stable": "macos-14.6-23G80", "previous": None}}, "is retired"),
        ({"channels": {"stable": "macos-99-99Z9", "previous": None}}, "not among the bases"),
        ({"channels": {"stable": None}}, "channels.previous: missing"),
        ({"schema_version": 2}, "schema_version"),
        ({"extra": 1}, "extra"),
    ],
    ids=["retired-channel", "unknown-channel-target", "missing-channel", "version", "unknown-key"],
)
def test_inconsistent_descriptors_are_refused(tmp_path: Path, change: dict[str, Any], text: str) -> None:
    with pytest.raises(UnavailableError, match=text):
        load_bases(_write(tmp_path, _descriptor(**change)))


def test_entries_must_match_their_id_and_name_replacements(tmp_path: Path) -> None:
    data = _descriptor()
    data["bases"]["macos-15.1-24B83"]["build"] = "24B84"
    with pytest.raises(UnavailableError, match="macos-<version>-<build>"):
        load_bases(_write(tmp_path, data))
    data = _descriptor()
    del data["bases"]["macos-14.6-23G80"]["replacement"]
    with pytest.raises(UnavailableError, match="names its replacement"):
        load_bases(_write(tmp_path, data))


def test_sha256_file_hashes_without_following_a_link(tmp_path: Path) -> None:
    target = tmp_path / "r.ipsw"
    target.write_bytes(b"a")
    assert sha256_file(target) == SHA_A
    (tmp_path / "link.ipsw").symlink_to(target)
    with pytest.raises(OSError):
        sha256_file(tmp_path / "link.ipsw")
