from __future__ import annotations

from pathlib import Path

import pytest

from vz_core.errors import InvalidArgumentError, NotFoundError
from vz_drivers._images import (
    DefaultRef,
    DockerArchiveRef,
    OciLayoutRef,
    Platform,
    RegistryRef,
    parse_reference,
)
from vz_drivers._images._reference import is_loopback_host

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("ref", "expected", "canonical"),
    [
        pytest.param("vz:default", DefaultRef("default"), "vz:default", id="default"),
        pytest.param("oci:/srv/layout", OciLayoutRef(Path("/srv/layout")), "oci:/srv/layout", id="oci-bare"),
        pytest.param(
            "oci:/srv/layout:v1", OciLayoutRef(Path("/srv/layout"), tag="v1"), "oci:/srv/layout:v1", id="oci-tag"
        ),
        pytest.param(
            f"oci:/srv/layout@{DIGEST}", OciLayoutRef(Path("/srv/layout"), digest=DIGEST), None, id="oci-digest"
        ),
        pytest.param(
            "docker-archive:/tmp/a.tar", DockerArchiveRef(Path("/tmp/a.tar")), "docker-archive:/tmp/a.tar", id="archive"
        ),
        pytest.param(
            "docker-archive:/tmp/a.tar:repo/x:1",
            DockerArchiveRef(Path("/tmp/a.tar"), "repo/x:1"),
            None,
            id="archive-tag",
        ),
        pytest.param(
            "127.0.0.1:5000/team/app",
            RegistryRef("127.0.0.1:5000", "team/app", "latest"),
            "127.0.0.1:5000/team/app:latest",
            id="registry-default-tag",
        ),
        pytest.param(
            "registry.example.test/app:1.2", RegistryRef("registry.example.test", "app", "1.2"), None, id="tag"
        ),
        pytest.param(
            f"localhost/app@{DIGEST}", RegistryRef("localhost", "app", None, DIGEST), None, id="registry-digest"
        ),
        pytest.param(
            f"docker://localhost:1/a/b:t@{DIGEST}",
            RegistryRef("localhost:1", "a/b", None, DIGEST),
            f"localhost:1/a/b@{DIGEST}",
            id="docker-scheme-tag-and-digest",
        ),
        pytest.param("[::1]:5000/app:x", RegistryRef("[::1]:5000", "app", "x"), None, id="ipv6"),
    ],
)
def test_parse_reference_accepts_each_documented_form(ref: str, expected: object, canonical: str | None) -> None:
    parsed = parse_reference(ref)
    assert parsed == expected
    assert str(parsed) == (canonical or ref)


@pytest.mark.parametrize(
    ("ref", "fragment"),
    [
        pytest.param("", "empty", id="empty"),
        pytest.param("ubuntu", "names no registry host", id="no-host"),
        pytest.param("library/ubuntu:22.04", "is not a registry host", id="no-host-with-path"),
        pytest.param("oci:relative/layout", "not absolute", id="oci-relative"),
        pytest.param("oci:/a/../b", "'..'", id="oci-dotdot"),
        pytest.param("docker-archive:", "path is empty", id="archive-empty"),
        pytest.param("localhost/App", "repository component", id="uppercase-repo"),
        pytest.param("localhost/app:bad!tag", "tag", id="bad-tag"),
        pytest.param("localhost/app@sha256:1234", "sha256 digest", id="short-digest"),
        pytest.param("local host/app", "whitespace", id="whitespace"),
    ],
)
def test_parse_reference_rejects_bad_input_with_an_actionable_message(ref: str, fragment: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        parse_reference(ref)
    assert fragment in str(info.value)


def test_unknown_embedded_image_is_not_found_and_lists_the_known_ones() -> None:
    with pytest.raises(NotFoundError, match="vz:default"):
        parse_reference("vz:alpine")


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("127.0.0.1", True),
        ("127.9.8.7", True),
        ("::1", True),
        ("[::1]", True),
        ("10.0.0.1", False),
        ("example.test", False),
        ("128.0.0.1", False),
    ],
)
def test_is_loopback_host(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


def test_platform_parse_and_match() -> None:
    assert Platform.parse("linux/arm64/v8").matches("linux", "arm64", "")
    assert Platform.parse("linux/amd64").matches("linux", "amd64", "v3")
    assert not Platform.parse("linux/amd64").matches("linux", "arm64")
    with pytest.raises(InvalidArgumentError, match="os/architecture"):
        Platform.parse("amd64")
