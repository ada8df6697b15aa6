"""OS-specific calls live in the platform layer (``vz_core.platform``) and the Linux-only packages only.

Outside ``vz_core/platform/``, ``vz_drivers/linux_native/`` and route domains (``vz_core/network/`` and qemu's
taps, ``vz_drivers/qemu/_attach.py``), no module
of the shipped packages imports an OS-specific module (``fcntl``, ``termios``, ``tty``, ``pty``, ``resource``,
``msvcrt``, ``winreg``, ``_winapi``) or uses a Linux-only attribute of ``os``, ``socket`` or ``signal``
(``pipe2``, ``SO_PEERCRED``, ``SOCK_CLOEXEC``, ``pidfd_open``, ``O_PATH``, ``setxattr``, ...): what runs on a
macOS or Windows host then never reaches one by accident, and ``mypy --platform darwin|win32`` checks each
host's branch of the layer. The benchmarks are a Linux tool (runc, docker) and are not covered.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TREES = (ROOT / "vz_core", ROOT / "vz_drivers", ROOT / "plugins/vz_plugins", ROOT / "conformance/vz_conformance")
ALLOWED = (
    ROOT / "vz_core/platform",
    ROOT / "vz_drivers/linux_native",
    ROOT / "vz_core/network",
    # qemu's half of route domains (taps created inside an Environment's namespace): Linux-only like them.
    ROOT / "vz_drivers/qemu/_attach.py",
)
EXCLUDED = (ROOT / "vz_core/_proto",)

OS_MODULES = frozenset({"fcntl", "termios", "tty", "pty", "resource", "msvcrt", "winreg", "_winapi"})
LINUX_ONLY = {
    "os": frozenset(
        {
            "pipe2",
            "O_PATH",
            "O_CLOEXEC",
            "O_TMPFILE",
            "pidfd_open",
            "setxattr",
            "getxattr",
            "listxattr",
            "removexattr",
            "memfd_create",
            "MFD_CLOEXEC",
            "MFD_ALLOW_SEALING",
            "sched_getaffinity",
            "sched_setaffinity",
            "splice",
            "eventfd",
            "unshare",
            "setns",
            "posix_fadvise",
        }
    ),
    "socket": frozenset(
        {"SO_PEERCRED", "SOCK_CLOEXEC", "SOCK_NONBLOCK", "MSG_CMSG_CLOEXEC", "AF_NETLINK", "NETLINK_ROUTE"}
    ),
    "_socket": frozenset({"SO_PEERCRED", "SOCK_CLOEXEC", "SOCK_NONBLOCK", "MSG_CMSG_CLOEXEC"}),
    "signal": frozenset({"pidfd_send_signal"}),
}


def violations_in(source: str) -> list[str]:
    """Each OS-specific import or Linux-only attribute use in ``source``, as ``line: what``."""
    found = []
    tree = ast.parse(source)
    aliases: dict[str, str] = {}  # local name -> os, socket, _socket or signal
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top in OS_MODULES:
                    found.append(f"{node.lineno}: import {alias.name}")
                if alias.name in LINUX_ONLY:
                    aliases[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            top = node.module.split(".")[0]
            if top in OS_MODULES:
                found.append(f"{node.lineno}: from {node.module} import ...")
            for alias in node.names:
                if alias.name in LINUX_ONLY.get(node.module, ()):
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = aliases.get(node.value.id)
            if module is not None and node.attr in LINUX_ONLY[module]:
                found.append(f"{node.lineno}: {node.value.id}.{node.attr}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[0], ast.Name)
            and isinstance(node.args[1], ast.Constant)
        ):
            module = aliases.get(node.args[0].id)
            if module is not None and node.args[1].value in LINUX_ONLY[module]:
                found.append(f"{node.lineno}: {node.func.id}({node.args[0].id}, {node.args[1].value!r})")
    return sorted(found, key=lambda item: int(item.split(":")[0]))


def _files() -> list[Path]:
    out = []
    for tree in TREES:
        for path in sorted(tree.rglob("*.py")):
            if any(path.is_relative_to(p) for p in (*ALLOWED, *EXCLUDED)):
                continue
            out.append(path)
    return out


def test_os_specific_calls_stay_in_the_platform_layer() -> None:
    problems = []
    for path in _files():
        for item in violations_in(path.read_text()):
            problems.append(f"{path.relative_to(ROOT)}:{item}")
    assert not problems, "OS-specific calls outside vz_core.platform (move them into the layer):\n" + "\n".join(
        problems
    )


def test_the_rule_flags_a_planted_import_fcntl() -> None:
    assert violations_in("import os\nimport fcntl\n") == ["2: import fcntl"]
    assert violations_in("def f():\n    from termios import tcgetattr\n") == ["2: from termios import ..."]
    assert violations_in("import os as _os\nr, w = _os.pipe2(0)\n") == ["2: _os.pipe2"]
    assert violations_in("import socket\ns = socket.SOCK_STREAM | socket.SOCK_CLOEXEC\n") == ["2: socket.SOCK_CLOEXEC"]
    assert violations_in("import os\nok = hasattr(os, 'pidfd_open')\n") == ["2: hasattr(os, 'pidfd_open')"]
    assert violations_in("from os import setxattr\n") == ["1: from os import setxattr"]
    assert violations_in("import os\nimport socket\nr, w = os.pipe()\ns = socket.socket()\n") == []


def test_the_rule_covers_the_host_program() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in _files()}
    assert "vz_core/wire/_connect.py" in names
    assert "vz_drivers/_machine/_procs.py" in names
    assert not any(n.startswith(("vz_core/platform/", "vz_drivers/linux_native/")) for n in names)
