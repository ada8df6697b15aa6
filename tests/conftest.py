"""Suite-wide guards: every test must leave no child process, mount, or environment change behind, and no vz
daemon running for a state home under its temporary directory (those are stopped after each test; one still
running when the session ends fails the run)."""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest


def _children() -> dict[int, float]:
    out: dict[int, float] = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            out[proc.pid] = proc.create_time()
        except psutil.Error:
            continue
    return out


def _mounts(root: str) -> set[str]:
    # Only mounts under this session's temporary root: other processes on the machine share the mount table.
    # scripts/leak-check.sh checks the whole machine after the suite.
    if not sys.platform.startswith("linux"):  # vz mounts nothing on macOS or Windows hosts
        return set()
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return {p for p in (line.split()[4] for line in lines) if p.startswith(root)}


def _vz_daemons(root: str) -> dict[int, str]:
    """pid → state home of every running vz daemon whose home lies under ``root``.

    Found two ways: the pid file of each ``<home>/daemon/daemon.json`` a few levels under ``root``, and the
    processes whose command line is a vz daemon's and whose VZ_HOME is under ``root`` (a daemon that has not
    written its pid file yet, or whose pid file was removed).
    """
    from vz_core.daemon import DaemonPaths, live_daemon

    root = os.path.join(os.path.realpath(root), "")
    found: dict[int, str] = {}
    for depth in ("*", "*/*", "*/*/*"):
        for pid_file in Path(root).glob(f"{depth}/daemon/daemon.json"):
            home = os.path.realpath(pid_file.parent.parent)
            record = live_daemon(DaemonPaths(home))
            if record is not None:
                found[record["pid"]] = home
    if not sys.platform.startswith("linux"):  # no /proc: the same search through psutil
        for proc in psutil.process_iter(["pid", "cmdline"]):
            try:
                argv = proc.info["cmdline"] or []
                if proc.pid in found or ("vz_core.daemon" not in argv and "daemon" not in argv):
                    continue
                home = proc.environ().get("VZ_HOME", "")
            except psutil.Error:
                continue
            if home and os.path.join(os.path.realpath(home), "").startswith(root):
                found[proc.pid] = home
        return found
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in found:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if b"vz_core.daemon" not in argv and b"daemon" not in argv:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        except OSError:
            continue
        home = os.fsdecode(env.get(b"VZ_HOME", b""))
        if home and os.path.join(os.path.realpath(home), "").startswith(root):
            found[int(entry)] = home
    return found


def _stop_daemons(daemons: dict[int, str]) -> None:
    for pid in daemons:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + 10.0
    for pid in daemons:
        while psutil.pid_exists(pid) and time.monotonic() < deadline:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.Error:
                break
            time.sleep(0.02)
        if psutil.pid_exists(pid):
            try:
                psutil.Process(pid).kill()  # SIGKILL; TerminateProcess on Windows
            except psutil.Error:
                pass


@pytest.fixture(autouse=True)
def _no_vz_daemon_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """Stops every vz daemon whose state home is under this test's tmp_path (clean-up, not a failure)."""
    yield
    tmp = request.node.funcargs.get("tmp_path") if hasattr(request.node, "funcargs") else None
    if tmp is not None:
        daemons = _vz_daemons(str(tmp))
        if daemons:
            _stop_daemons(daemons)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A vz daemon of a home under the session's temporary root that outlived every test fails the run."""
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None:
        return
    try:
        root = str(factory.getbasetemp())
    except Exception:  # no test used a temporary directory
        return
    daemons = _vz_daemons(root)
    if daemons:
        _stop_daemons(daemons)
        listing = ", ".join(f"pid {pid} for {home}" for pid, home in sorted(daemons.items()))
        sys.stderr.write(f"\nERROR: vz daemons outlived the test session (now killed): {listing}\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}


@pytest.fixture(autouse=True)
def _no_leaks(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    root = str(tmp_path_factory.getbasetemp())
    before_children = _children()
    before_mounts = _mounts(root)
    before_env = _env()
    yield
    # Processes get a short grace period to finish exiting (killed trees are reaped asynchronously).
    deadline = time.monotonic() + 5.0
    leaked: dict[int, float] = {}
    while True:
        leaked = {pid: t for pid, t in _children().items() if before_children.get(pid) != t}
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    problems: list[str] = []
    if leaked:
        names = []
        for pid in leaked:
            try:
                names.append(f"{pid} {' '.join(psutil.Process(pid).cmdline())[:120]}")
            except psutil.Error:
                names.append(str(pid))
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
        problems.append("child processes left behind: " + "; ".join(names))
    new_mounts = _mounts(root) - before_mounts
    if new_mounts:
        problems.append(f"mounts left behind: {sorted(new_mounts)}")
    env_now = _env()
    if env_now != before_env:
        changed = sorted(k for k in set(env_now) | set(before_env) if env_now.get(k) != before_env.get(k))
        for key in changed:
            if key in before_env:
                os.environ[key] = before_env[key]
            else:
                os.environ.pop(key, None)
        problems.append(f"environment variables changed: {changed}")
    if problems:
        pytest.fail(f"{request.node.nodeid} leaked: " + " | ".join(problems), pytrace=False)


_IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
# Held for the whole test by every test that changes the host's routing (the workers of one run are processes).
_HOST_ROUTING_LOCK = Path(tempfile.gettempdir()) / "vz-tests-host-routing.lock"


@pytest.fixture
def host_ipv4_forwarding() -> Iterator[None]:
    """``net.ipv4.ip_forward`` on for the test, the host's earlier value back afterwards.

    A version 2 Environment's egress needs the host to forward IPv4 and vz refuses to turn it on by itself, so a
    test of egress sets it as the host's administrator would (a fresh host has it off). The sysctl, and the
    test networks and routes such tests add to the host, are the host's: one such test runs at a time, whichever
    worker of the suite runs it (an exclusive lock held from before the change until after the restore).
    """
    import fcntl  # Linux only, like the routing it guards

    with open(_HOST_ROUTING_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        before = _IP_FORWARD.read_text().strip()
        if before != "1":
            _IP_FORWARD.write_text("1")
        try:
            yield
        finally:
            if _IP_FORWARD.read_text().strip() != before:
                _IP_FORWARD.write_text(before)


# Longest first: the suite runs on several workers (scripts/test.sh, pytest-xdist by module), and a long module
# started last would run on alone after every other worker is done. Each entry is a test file, in the order to
# start them; the rest keep their order after them.
_LONGEST_FIRST = (
    "tests/vz_drivers/qemu/test_qemu_conformance.py",
    "tests/vz_conformance/test_suite_fault_table.py",
    "tests/vz_drivers/linux_native/test_linux_native_conformance.py",
)


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects: the marker added here counts
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "host_ipv4_forwarding" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.host_exclusive)
    rank = {path: i for i, path in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))  # stable: the rest as found


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A test that failed on a vz error shows the error's backend diagnostics (``runtime_message``: the console or
    runtime log tail a driver attached) beside the traceback, which shows only the message."""
    report = yield
    excinfo = call.excinfo
    if excinfo is not None and report.failed:  # type: ignore[attr-defined]
        from vz_core.errors import DriverError

        seen: set[int] = set()
        error: BaseException | None = excinfo.value
        while error is not None and id(error) not in seen:  # the error itself, or one it was raised from
            seen.add(id(error))
            if isinstance(error, DriverError) and error.runtime_message.strip():
                report.sections.append(  # type: ignore[attr-defined]
                    (f"vz runtime message ({type(error).__name__})", error.runtime_message[-6000:])
                )
                break
            error = error.__cause__ or error.__context__
    return report
