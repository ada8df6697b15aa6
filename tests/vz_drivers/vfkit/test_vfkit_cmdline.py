"""The vfkit command line, checked with a parser written from vfkit's documented grammar (vfkit_grammar)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vfkit_grammar import GrammarError, parse_argv, parse_bootloader, parse_device, split_string_slice

from vz_core.errors import InvalidArgumentError
from vz_drivers.vfkit._cmdline import AGENT_VSOCK_PORT, READY_VSOCK_PORT, Share, VfkitSpec, build_argv, restful_uri

BASE = VfkitSpec(
    cpus=2,
    memory_mib=2048,
    kernel="/Users/dev/vz/Image",
    initrd="/Users/dev/vz/initramfs.cpio.gz",
    cmdline=("console=hvc0", "quiet", "panic=-1"),
    disk="/Users/dev/vz/m/disk.img",
    console_log="/Users/dev/vz/m/console.log",
    rest_socket="/Users/dev/vz/m/rest.sock",
    agent_socket="/Users/dev/vz/m/agent.sock",
    ready_socket="/Users/dev/vz/m/ready.sock",
)


def _roundtrip(spec: VfkitSpec) -> None:
    argv = build_argv("/opt/vfkit", spec)
    assert argv[0] == "/opt/vfkit"
    parsed = parse_argv(argv[1:])
    assert parsed.cpus == spec.cpus
    assert parsed.memory_mib == spec.memory_mib
    assert (parsed.kernel, parsed.initrd) == (spec.kernel, spec.initrd)
    assert parsed.cmdline == " ".join(spec.cmdline)
    assert parsed.restful_path == spec.rest_socket
    assert parsed.nested is spec.nested
    (blk,) = parsed.of("virtio-blk")
    assert blk.options == {"path": spec.disk}
    (serial,) = parsed.of("virtio-serial")
    assert serial.options == {"logFilePath": spec.console_log}
    nets = parsed.of("virtio-net")
    assert len(nets) == (1 if spec.network else 0)
    for net in nets:
        attachment = {"unixSocketPath": spec.network_socket} if spec.network_socket else {}
        assert net.flags == (set() if spec.network_socket else {"nat"})  # nat and unixSocketPath are exclusive
        assert net.options == {**attachment, **({"mac": spec.mac.lower()} if spec.mac else {})}
    vsock = {int(d.options["port"]): d for d in parsed.of("virtio-vsock")}
    assert vsock[AGENT_VSOCK_PORT].options["socketURL"] == spec.agent_socket
    assert vsock[AGENT_VSOCK_PORT].flags == {"connect"}
    assert vsock[READY_VSOCK_PORT].options["socketURL"] == spec.ready_socket
    assert vsock[READY_VSOCK_PORT].flags == {"listen"}
    shares = [(d.options["mountTag"], d.options["sharedDir"]) for d in parsed.of("virtio-fs")]
    assert shares == [(s.tag, s.path) for s in spec.shares]
    rosetta = parsed.of("rosetta")
    assert [d.options["mountTag"] for d in rosetta] == ([spec.rosetta_tag] if spec.rosetta_tag else [])
    assert len(parsed.of("virtio-rng")) == (1 if spec.rng else 0)


def test_base_command_line_is_exactly_what_the_docs_describe() -> None:
    argv = build_argv("/opt/vfkit", BASE)
    assert argv == [
        "/opt/vfkit",
        "--cpus",
        "2",
        "--memory",
        "2048",
        "--bootloader",
        'linux,kernel=/Users/dev/vz/Image,initrd=/Users/dev/vz/initramfs.cpio.gz,cmdline="console=hvc0 quiet panic=-1"',
        "--restful-uri",
        "unix:///Users/dev/vz/m/rest.sock",
        "--device",
        "virtio-blk,path=/Users/dev/vz/m/disk.img",
        "--device",
        "virtio-serial,logFilePath=/Users/dev/vz/m/console.log",
        "--device",
        "virtio-net,nat",
        "--device",
        "virtio-rng",
        "--device",
        "virtio-vsock,port=1024,socketURL=/Users/dev/vz/m/agent.sock,connect",
        "--device",
        "virtio-vsock,port=1025,socketURL=/Users/dev/vz/m/ready.sock,listen",
    ]
    _roundtrip(BASE)


def test_every_optional_device_round_trips() -> None:
    spec = dataclasses.replace(
        BASE,
        shares=(Share("vz-ws", "/Users/dev/my project"), Share("vz-m1", "/Volumes/data=x", read_only=True)),
        mac="5A:94:EF:E4:0C:EE",
        rosetta_tag="vz-rosetta",
        nested=True,
        cmdline=("console=hvc0", "vz.mounts=a,b,c"),
    )
    _roundtrip(spec)
    assert build_argv("/opt/vfkit", spec)[-1] == "--nested"


def test_a_user_space_network_attaches_through_a_unix_socket() -> None:
    spec = dataclasses.replace(BASE, network_socket="/Users/dev/vz/m/net.sock", mac="5a:94:ef:e4:0c:ee")
    _roundtrip(spec)
    assert "virtio-net,unixSocketPath=/Users/dev/vz/m/net.sock,mac=5a:94:ef:e4:0c:ee" in build_argv("/v", spec)


def test_egress_deny_has_no_network_device() -> None:
    spec = dataclasses.replace(BASE, network=False)
    _roundtrip(spec)
    assert not any(a.startswith("virtio-net") for a in build_argv("/opt/vfkit", spec))


def test_the_grammar_parser_is_the_documented_one() -> None:
    # The documentation's own example (shell quoting removed).
    kernel, initrd, cmdline = parse_bootloader(
        'linux,kernel=/k/vmlinuz,initrd=/k/initramfs.img,cmdline="console=hvc0 root=UUID=164b rw"'
    )
    assert (kernel, initrd, cmdline) == ("/k/vmlinuz", "/k/initramfs.img", "console=hvc0 root=UUID=164b rw")
    assert split_string_slice('"a","b"') == ["a", "b"]
    with pytest.raises(GrammarError):
        split_string_slice('a,"b')
    dev = parse_device("virtio-vsock,port=6,socketURL=/Users/virtuser/vfkit-6.sock,connect")
    assert dev.options == {"port": "6", "socketURL": "/Users/virtuser/vfkit-6.sock"} and dev.flags == {"connect"}
    # A comma in a device value silently changes the meaning: the parser shows it.
    with pytest.raises(GrammarError):
        parse_device("virtio-fs,sharedDir=/a,b,mountTag=t")


@pytest.mark.parametrize(
    ("change", "culprit"),
    [
        ({"disk": "/a,b/disk.img"}, "comma"),
        ({"kernel": "/k,1/Image"}, "comma"),
        ({"kernel": '/k"1/Image'}, "double quote"),
        ({"initrd": "relative/initrd"}, "absolute"),
        ({"cmdline": ('console="hvc0"',)}, "double quote"),
        ({"cmdline": ()}, "empty"),
        ({"cmdline": ("a\nb",)}, "control"),
        ({"shares": (Share("bad tag", "/x"),)}, "tag"),
        ({"shares": (Share("t" * 37, "/x"),)}, "tag"),
        ({"shares": (Share("t", "/x"), Share("t", "/y"))}, "twice"),
        ({"shares": (Share("t", "/x,y"),)}, "comma"),
        ({"mac": "5a:94:ef"}, "MAC"),
        ({"cpus": 0}, "cpus"),
        ({"memory_mib": 0}, "memory"),
        ({"rest_socket": "rest.sock"}, "absolute"),
    ],
    ids=lambda v: str(v)[:40],
)
def test_unrepresentable_values_are_refused_with_the_culprit(change: dict[str, object], culprit: str) -> None:
    with pytest.raises(InvalidArgumentError, match=culprit):
        build_argv("/opt/vfkit", dataclasses.replace(BASE, **change))  # type: ignore[arg-type]


def test_restful_uri_percent_encodes_what_a_uri_cannot_hold() -> None:
    uri = restful_uri("/Users/a b/#x?y%/rest.sock")
    assert " " not in uri and "#" not in uri and "?" not in uri
    from vfkit_grammar import parse_restful_uri

    assert parse_restful_uri(uri) == "/Users/a b/#x?y%/rest.sock"


_PATH_CHARS = st.sampled_from([*"abcXYZ019 ._-=/,\"'#?%~é日", "\u00a0"])
_paths = st.lists(_PATH_CHARS, min_size=1, max_size=24).map(lambda cs: "/" + "".join(cs))
_words = st.lists(st.sampled_from(list('abc=,.-_ 019"/:')), min_size=1, max_size=16).map("".join)


@settings(max_examples=300, deadline=None)
@given(
    kernel=_paths,
    disk=_paths,
    share=_paths,
    words=st.lists(_words, min_size=1, max_size=5),
    tag=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,40}", fullmatch=True),
)
def test_any_value_either_round_trips_or_is_refused(
    kernel: str, disk: str, share: str, words: list[str], tag: str
) -> None:
    spec = dataclasses.replace(BASE, kernel=kernel, disk=disk, shares=(Share(tag, share),), cmdline=tuple(words))
    line = " ".join(words)
    representable = (
        "," not in kernel
        and '"' not in kernel
        and "," not in disk
        and "," not in share
        and '"' not in line
        and line.strip() != ""
        and len(tag.encode()) <= 36
    )
    if representable:
        _roundtrip(spec)
    else:
        with pytest.raises(InvalidArgumentError):
            build_argv("/opt/vfkit", spec)


def test_sockets_move_out_of_a_deep_state_directory(tmp_path: Path) -> None:
    from vz_drivers.vfkit._records import SOCKET_LIMIT, VfkitPaths, socket_dir

    key = "0123456789abcdef" * 2
    shallow = VfkitPaths(Path("/s") / key)
    assert socket_dir(shallow, key) == shallow.run
    deep = VfkitPaths(tmp_path / ("d" * 80) / key)
    moved = socket_dir(deep, key)
    try:
        assert moved != deep.run and len(os.fsencode(moved / "ready.sock")) <= SOCKET_LIMIT
        assert stat.S_IMODE(moved.stat().st_mode) == 0o700 and moved.stat().st_uid == os.geteuid()
        assert socket_dir(deep, key, create=False) == moved
    finally:
        shutil.rmtree(moved, ignore_errors=True)
        if not any(moved.parent.iterdir()):
            moved.parent.rmdir()
