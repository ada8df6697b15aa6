"""The vfkit driver against stand-ins that behave as upstream vfkit does where the driver once assumed otherwise.

* ``--nested`` exists from vfkit v0.6.2 on (crc-org/vfkit ``pkg/cmdline/cmdline.go``, ``doc/usage.md``); the
  driver accepts vfkit 0.6.0, so nested=on must be refused, with the reason, on an older vfkit (the stand-in
  0.6.1 stops at the unknown flag, as cobra does).
* ``--restful-uri``: vfkit's ``pkg/rest/rest.go`` ``parseRestfulURI`` takes the value through Go's
  ``url.ParseRequestURI`` and listens on the URL's decoded ``Path``. The stand-in here is that code compiled
  with this host's Go toolchain, so the socket path vfkit would create is Go's reading, not a re-implementation.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import pytest
from vfkit_standin import write_executable

from vz_core.errors import FailedPreconditionError, InvalidArgumentError
from vz_drivers._guest import write_bundle
from vz_drivers.vfkit._backend import VfkitBackend
from vz_drivers.vfkit._cmdline import restful_uri
from vz_drivers.vfkit._host import HostSupport


def _backend(root: Path, version: str) -> VfkitBackend:
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), "amd64")
    mac = HostSupport(system="Darwin", macos_version=(15, 1), architecture=arch, reason="", rosetta=False, nested=True)
    bundle = write_bundle(
        root / "guest",
        {"Image": b"stand-in kernel", "initramfs.cpio": b"stand-in initramfs"},
        arch=arch,
        fmt="vfkit",
        roles={"kernel": "Image", "initrd": "initramfs.cpio"},
    )
    vfkit = write_executable(root / f"vfkit-{version}", "obey", version=version)
    return VfkitBackend(host=mac, state_dir=str(root / "state"), vfkit=str(vfkit), guest=str(bundle.root), nested="on")


def test_the_stand_in_0_6_1_refuses_nested_as_vfkit_does(tmp_path: Path) -> None:
    vfkit = write_executable(tmp_path / "old", "obey", version="0.6.1")
    done = subprocess.run([str(vfkit), "--nested"], capture_output=True, text=True, check=False)
    assert done.returncode == 1 and "unknown flag: --nested" in done.stderr


async def test_nested_on_is_refused_on_a_vfkit_older_than_0_6_2(tmp_path: Path) -> None:
    backend = _backend(tmp_path, "0.6.1")
    with pytest.raises(
        FailedPreconditionError, match=r"nested=on needs vfkit 0\.6\.2 or newer .* this vfkit is 0\.6\.1"
    ):
        await backend.provisioning_preflight()


async def test_nested_on_passes_the_check_on_vfkit_0_6_2(tmp_path: Path) -> None:
    backend = _backend(tmp_path, "0.6.2")
    await backend.provisioning_preflight()  # nothing refused: the host may nest and vfkit knows --nested


_GO_PARSER = """
package main

// vfkit's pkg/rest/rest.go parseRestfulURI for the unix scheme, then the path RunUnix listens on.
import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
)

func parse(input string) (string, error) {
	restURI, err := url.ParseRequestURI(input)
	if err != nil {
		return "", err
	}
	if strings.ToUpper(restURI.Scheme) != "UNIX" {
		return "", errors.New("invalid scheme")
	}
	if len(restURI.Path) < 1 {
		return "", errors.New("invalid unix uri: missing path")
	}
	if len(restURI.Host) > 0 {
		return "", errors.New("invalid unix uri: host is forbidden")
	}
	return restURI.Path, nil
}

func main() {
	path, err := parse(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Print(path)
}
"""


@pytest.fixture(scope="module")
def go_parser(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("go") is None:
        pytest.fail("go is missing (scripts/install-deps.sh installs golang-go)")
    root = tmp_path_factory.mktemp("vfkit-uri")
    (root / "main.go").write_text(_GO_PARSER)
    env = {"PATH": "/usr/bin:/bin:/usr/local/go/bin", "HOME": str(root), "GOCACHE": str(root / "cache")}
    subprocess.run(["go", "build", "-o", str(root / "parse"), str(root / "main.go")], check=True, env=env, cwd=root)
    return root / "parse"


@pytest.mark.parametrize(
    "path",
    [
        "/Users/a b/Library/vz/rest.sock",
        "/tmp/100%/rest.sock",
        "/tmp/%41/rest.sock",
        "/tmp/q?x=1/rest.sock",
        "/tmp/frag#ment/rest.sock",
        "/tmp/semi;colon/plus+sign/rest.sock",
        "/tmp/ünïcode ✓/rest.sock",
        "/tmp/at@sign/[brackets]/rest.sock",
        "//double/slash.sock",
    ],
)
def test_restful_uri_is_read_by_vfkit_as_the_socket_path(go_parser: Path, path: str) -> None:
    uri = restful_uri(path)
    done = subprocess.run([str(go_parser), uri], capture_output=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == path, uri


def test_restful_uri_refuses_what_no_uri_carries() -> None:
    with pytest.raises(InvalidArgumentError, match="control character"):
        restful_uri("/tmp/line\nbreak.sock")
