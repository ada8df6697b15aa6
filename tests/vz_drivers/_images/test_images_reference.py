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
        # Docker's normalization: no registry host means Docker Hub; one component gets library/.
        pytest.param("alpine", RegistryRef("docker.io", "library/alpine"), "docker.io/library/alpine:latest", id="hub"),
        pytest.param(
            "ubuntu:24.04",
            RegistryRef("docker.io", "library/ubuntu", "24.04"),
            "docker.io/library/ubuntu:24.04",
            id="hub-tag",
        ),
        pytest.param(
            "library/debian:12",
            RegistryRef("docker.io", "library/debian", "12"),
            "docker.io/library/debian:12",
            id="hub-lib",
        ),
        pytest.param("myorg/app", RegistryRef("docker.io", "myorg/app"), "docker.io/myorg/app:latest", id="hub-org"),
        pytest.param(
            "docker.io/alpine:3",
            RegistryRef("docker.io", "library/alpine", "3"),
            "docker.io/library/alpine:3",
            id="hub-host",
        ),
        pytest.param(
            "index.docker.io/a/b", RegistryRef("docker.io", "a/b"), "docker.io/a/b:latest", id="hub-index-alias"
        ),
        pytest.param(
            f"alpine@{DIGEST}",
            RegistryRef("docker.io", "library/alpine", None, DIGEST),
            f"docker.io/library/alpine@{DIGEST}",
            id="hub-digest",
        ),
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
        pytest.param("Ubuntu", "repository component", id="hub-uppercase"),
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


def test_docker_hub_is_served_at_its_registry_endpoint() -> None:
    hub = parse_reference("alpine")
    assert isinstance(hub, RegistryRef) and hub.endpoint == "registry-1.docker.io"
    other = parse_reference("ghcr.io/a/b")
    assert isinstance(other, RegistryRef) and other.endpoint == "ghcr.io"
