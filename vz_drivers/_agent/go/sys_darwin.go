package main

import (
	"encoding/binary"
	"os"
	"syscall"
	"unsafe"
)

// macOS: the agent runs as a launchd job inside the guest. launchd adopts orphans (there is no
// child subreaper), the guest's boot script mounts the shares before the agent starts, and the
// agent never powers the machine off itself.

const fionread = 0x4004667f

func setSubreaper() error { return nil }

func mountEssentials() {}

func (ag *agent) mountRoot() error { return nil }

func (ag *agent) unmountRoot() {}

func unmountAll() {}

func powerOff() {}

// platformRefusal: the serve options macOS cannot honour ("" when none).
func platformRefusal(o options) string {
	switch {
	case o.prepareRoot:
		return "--prepare-root is not supported on darwin (the agent mounts nothing there)"
	case o.poweroff:
		return "--poweroff is not supported on darwin (the agent is not the machine's init there)"
	}
	return ""
}

// setParentDeathSignal: macOS has no parent-death signal; the agent kills a command's process
// group when it ends or is cancelled.
func setParentDeathSignal(attr *syscall.SysProcAttr) {}

func memTotal() uint64 {
	s, err := syscall.Sysctl("hw.memsize")
	if err != nil {
		return 0
	}
	b := make([]byte, 8) // Sysctl drops one trailing NUL byte of the little-endian value
	copy(b, s)
	return binary.LittleEndian.Uint64(b)
}

// unameFacts: the kernel release and host name (sysctl kern.osrelease, gethostname).
func unameFacts() (release, hostname string) {
	release, _ = syscall.Sysctl("kern.osrelease")
	hostname, _ = os.Hostname()
	return release, hostname
}

// isTerminalFd: a terminal's ioctl (TIOCGETA) answers on fd.
func isTerminalFd(fd int) bool {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFCHR {
		return false
	}
	var t syscall.Termios
	return ioctl(uintptr(fd), syscall.TIOCGETA, unsafe.Pointer(&t)) == nil
}

// setPipeSize: macOS pipes grow on their own; nothing to ask for.
func setPipeSize(f *os.File, n int) {}

// protectSelf: macOS has no dumpable flag; its task ports need the debugger entitlement or root.
func protectSelf() error { return nil }
