"""A parser of vfkit's command line written from its documentation and flag code, independent of the driver.

Sources (vfkit 0.6): doc/usage.md; pkg/cmdline/cmdline.go (flags: --cpus/-c, --memory/-m, --bootloader/-b,
--device/-d (string array), --restful-uri, --nested/-n, --log-level, --gui, --timesync); the bootloader value
is split by pkg/cmdline/string_slice.go (commas outside double quotes; quotes kept; an item that starts and
ends with a quote has them trimmed) and pkg/config/bootloader.go (``cmdline`` value quote-trimmed, ``kernel``
and ``initrd`` verbatim); device values by pkg/config/virtio.go ``deviceFromCmdLine`` (``strings.Split`` on
every comma, ``key=value`` split at the first ``=``, empty items skipped); the REST URI by pkg/rest
``ParseRestfulURI`` (scheme unix, no host, non-empty path).
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field

BOOL_FLAGS = {"--nested", "--gui"}
VALUE_FLAGS = {"--cpus", "--memory", "--bootloader", "--device", "--restful-uri", "--log-level", "--timesync"}
DEVICE_KEYS = {
    "virtio-blk": {"path", "deviceId", "readonly", "uri"},
    "virtio-fs": {"sharedDir", "mountTag"},
    "virtio-net": {"nat", "mac", "fd", "unixSocketPath"},
    "virtio-rng": set(),
    "virtio-serial": {"logFilePath", "stdio", "pty"},
    "virtio-vsock": {"port", "socketURL", "listen", "connect"},
    "rosetta": {"mountTag", "install", "ignore-if-missing"},
}


class GrammarError(ValueError):
    pass


@dataclass
class Device:
    kind: str
    options: dict[str, str] = field(default_factory=dict)
    flags: set[str] = field(default_factory=set)


@dataclass
class Parsed:
    cpus: int = 1
    memory_mib: int = 512
    kernel: str = ""
    initrd: str = ""
    cmdline: str = ""
    restful_path: str = ""
    nested: bool = False
    devices: list[Device] = field(default_factory=list)

    def of(self, kind: str) -> list[Device]:
        return [d for d in self.devices if d.kind == kind]


def _trim_quotes(text: str) -> str:
    # Go: strings.HasPrefix && HasSuffix -> strings.Trim(str, `"`) (every leading/trailing quote)
    if text.startswith('"') and text.endswith('"'):
        return text.strip('"')
    return text


def split_string_slice(value: str) -> list[str]:
    """pkg/cmdline parseString: commas outside quotes separate; quotes stay; each item quote-trimmed."""
    items: list[str] = []
    current: list[str] = []
    quoted = False
    for char in value:
        if quoted:
            if char == '"':
                quoted = False
            current.append(char)
            continue
        if char == ",":
            items.append(_trim_quotes("".join(current)))
            current = []
        else:
            if char == '"':
                quoted = True
            current.append(char)
    if quoted:
        raise GrammarError('mismatched "')
    last = _trim_quotes("".join(current))
    if items or last:
        items.append(last)
    return items


def _options(items: list[str]) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    for item in items:
        if not item:
            continue
        key, sep, value = item.partition("=")
        out.append((key, value if sep else None))
    return out


def parse_bootloader(value: str) -> tuple[str, str, str]:
    items = split_string_slice(value)
    if not items or items[0] != "linux":
        raise GrammarError(f"not a linux bootloader: {value!r}")
    kernel = initrd = cmdline = ""
    for key, val in _options(items[1:]):
        if key == "kernel":
            kernel = val or ""
        elif key == "initrd":
            initrd = val or ""
        elif key == "cmdline":
            cmdline = _trim_quotes(val or "")
        else:
            raise GrammarError(f"unknown option for linux bootloaders: {key}")
    if not kernel or not initrd or not cmdline:
        raise GrammarError("kernel, initrd and cmdline are all required")
    return kernel, initrd, cmdline


def parse_device(value: str) -> Device:
    parts = value.split(",")
    kind = parts[0]
    if kind not in DEVICE_KEYS:
        raise GrammarError(f"unknown device type: {kind}")
    device = Device(kind)
    for key, val in _options(parts[1:]):
        if key not in DEVICE_KEYS[kind]:
            raise GrammarError(f"unknown option for {kind} devices: {key}")
        if val is None:
            device.flags.add(key)
        else:
            device.options[key] = val
    return device


def parse_restful_uri(value: str) -> str:
    parts = urllib.parse.urlsplit(value)
    if parts.scheme.lower() != "unix" or parts.netloc or not parts.path:
        raise GrammarError(f"invalid unix uri: {value!r}")
    if parts.query or parts.fragment:
        raise GrammarError(f"unix uri with a query or fragment: {value!r}")
    if any(c in value for c in ' \t\n"'):
        raise GrammarError(f"uri is not percent-encoded: {value!r}")
    return urllib.parse.unquote(parts.path)


def parse_argv(argv: list[str], version: tuple[int, int, int] = (0, 6, 2)) -> Parsed:
    """Parse vfkit's arguments (without the program name), as vfkit ``version`` (0.6.x) would: ``--nested``
    exists from v0.6.2 on (crc-org/vfkit pkg/cmdline/cmdline.go); cobra refuses an unknown flag."""
    parsed = Parsed()
    index = 0
    seen_bootloader = False
    while index < len(argv):
        flag = argv[index]
        if flag == "--nested" and version < (0, 6, 2):
            raise GrammarError(f"unknown flag: {flag}")
        if flag in BOOL_FLAGS:
            if flag == "--nested":
                parsed.nested = True
            index += 1
            continue
        if flag not in VALUE_FLAGS:
            raise GrammarError(f"unknown flag: {flag}")
        if index + 1 >= len(argv):
            raise GrammarError(f"flag needs an argument: {flag}")
        value = argv[index + 1]
        index += 2
        if flag == "--cpus":
            parsed.cpus = int(value)
        elif flag == "--memory":
            parsed.memory_mib = int(value)
        elif flag == "--bootloader":
            if seen_bootloader:
                raise GrammarError("--bootloader given twice")
            seen_bootloader = True
            parsed.kernel, parsed.initrd, parsed.cmdline = parse_bootloader(value)
        elif flag == "--device":
            parsed.devices.append(parse_device(value))
        elif flag == "--restful-uri":
            parsed.restful_path = parse_restful_uri(value)
    if not seen_bootloader:
        raise GrammarError("a bootloader is mandatory")
    return parsed
