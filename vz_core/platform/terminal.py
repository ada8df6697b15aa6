"""The local terminal of `vz exec -it`: raw mode, and window size changes.

POSIX: termios raw mode (``tty.setraw``), restored with ``TCSADRAIN``; the window size of a pseudo-terminal is
set with ``TIOCSWINSZ`` and changes arrive as ``SIGWINCH``. Windows: the console API: input without line
editing, echo or Ctrl-C processing and with virtual-terminal input (``ENABLE_VIRTUAL_TERMINAL_INPUT``), output
with virtual-terminal processing, both modes restored afterwards; Windows has no SIGWINCH
(``WINDOW_SIGNAL`` is None) and a session reads the size with ``os.get_terminal_size`` when it sends input.
"""

from __future__ import annotations

import signal
import struct
import sys
from typing import Any

__all__ = ["WINDOW_SIGNAL", "RawTerminal", "raw_console_modes", "set_window_size"]


_ENABLE_PROCESSED_INPUT = 0x0001
_ENABLE_LINE_INPUT = 0x0002
_ENABLE_ECHO_INPUT = 0x0004
_ENABLE_VIRTUAL_TERMINAL_INPUT = 0x0200
_ENABLE_PROCESSED_OUTPUT = 0x0001
_ENABLE_VIRTUAL_TERMINAL_PROCESSING = 0x0004


def raw_console_modes(input_mode: int, output_mode: int) -> tuple[int, int]:
    """The console modes of a raw session, from the current ones (pure logic, tested on every host)."""
    raw_in = (input_mode & ~(_ENABLE_LINE_INPUT | _ENABLE_ECHO_INPUT | _ENABLE_PROCESSED_INPUT)) | (
        _ENABLE_VIRTUAL_TERMINAL_INPUT
    )
    raw_out = output_mode | _ENABLE_PROCESSED_OUTPUT | _ENABLE_VIRTUAL_TERMINAL_PROCESSING
    return raw_in, raw_out


if sys.platform == "win32":
    import ctypes
    import msvcrt
    from ctypes import wintypes

    WINDOW_SIGNAL: int | None = None

    _kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    _GetConsoleMode = _kernel32.GetConsoleMode
    _GetConsoleMode.argtypes = [wintypes.HANDLE, ctypes.POINTER(wintypes.DWORD)]
    _GetConsoleMode.restype = wintypes.BOOL
    _SetConsoleMode = _kernel32.SetConsoleMode
    _SetConsoleMode.argtypes = [wintypes.HANDLE, wintypes.DWORD]
    _SetConsoleMode.restype = wintypes.BOOL

    def _mode(handle: int) -> int:
        value = wintypes.DWORD()
        if not _GetConsoleMode(handle, ctypes.byref(value)):
            raise ctypes.WinError(ctypes.get_last_error())
        return int(value.value)

    def _set(handle: int, mode: int) -> None:
        if not _SetConsoleMode(handle, mode):
            raise ctypes.WinError(ctypes.get_last_error())

    class RawTerminal:
        """The console of ``fd`` (standard input) in raw mode; ``restore()`` (idempotent) puts both modes back."""

        def __init__(self, fd: int, out_fd: int = 1) -> None:
            self._in = msvcrt.get_osfhandle(fd)
            self._out = msvcrt.get_osfhandle(out_fd)
            self._saved: tuple[int, int] | None = (_mode(self._in), _mode(self._out))
            raw_in, raw_out = raw_console_modes(*self._saved)
            _set(self._in, raw_in)
            _set(self._out, raw_out)

        def restore(self) -> None:
            saved, self._saved = self._saved, None
            if saved is not None:
                try:
                    _set(self._in, saved[0])
                    _set(self._out, saved[1])
                except OSError:  # the console went away
                    pass

    def set_window_size(fd: int, rows: int, cols: int) -> None:
        """A Windows console is sized by its window: ``OSError`` (a Machine's pseudo-terminal is sized inside
        the Machine, by its agent)."""
        raise OSError("a Windows console's size follows its window")

else:
    import fcntl
    import termios
    import tty

    WINDOW_SIGNAL = signal.SIGWINCH
    """The signal that reports a change of the terminal's window size (None where there is none)."""

    class RawTerminal:
        """Our terminal ``fd`` in raw mode for the session; ``restore()`` (idempotent) puts every setting back."""

        def __init__(self, fd: int, out_fd: int = 1) -> None:
            self._fd = fd
            self._saved: list[Any] | None = termios.tcgetattr(fd)
            tty.setraw(fd, termios.TCSANOW)

        def restore(self) -> None:
            saved, self._saved = self._saved, None
            if saved is not None:
                try:
                    termios.tcsetattr(self._fd, termios.TCSADRAIN, saved)
                except (OSError, termios.error):  # a hung-up terminal has no settings left
                    pass

    def set_window_size(fd: int, rows: int, cols: int) -> None:
        """Set the window size of the terminal ``fd`` refers to (either side of a pseudo-terminal pair)."""
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
