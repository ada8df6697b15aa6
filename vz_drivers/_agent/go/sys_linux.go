package main

import (
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

const (
	prSetChildSubreaper = 36
	fionread            = 0x541B
)

func setSubreaper() error {
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		return errno
	}
	return nil
}

// mountEssentials gives an agent running as a VM's init (--poweroff) /proc, /sys and /dev if the
// initramfs did not mount them.
func mountEssentials() {
	for _, m := range []struct{ target, fstype string }{{"/proc", "proc"}, {"/sys", "sysfs"}, {"/dev", "devtmpfs"}} {
		os.MkdirAll(m.target, 0o755)
		if !isMountpoint(m.target) {
			if err := syscall.Mount(m.fstype, m.target, m.fstype, 0, ""); err != nil {
				logf("mounting %s: %v", m.target, err)
			}
		}
	}
}

// mountRoot (--prepare-root) mounts proc, sysfs and the agent's /dev inside the root.
func (ag *agent) mountRoot() error {
	for _, m := range []struct {
		target, fstype, source string
		flags                  uintptr
	}{
		{"/proc", "proc", "proc", 0},
		{"/sys", "sysfs", "sysfs", 0},
		{"/dev", "", "/dev", syscall.MS_BIND | syscall.MS_REC},
	} {
		target := filepath.Join(ag.root, m.target)
		if err := os.MkdirAll(target, 0o755); err != nil {
			return err
		}
		if isMountpoint(target) {
			continue
		}
		if err := syscall.Mount(m.source, target, m.fstype, m.flags, ""); err != nil {
			return err
		}
		ag.mounts = append(ag.mounts, target)
	}
	return nil
}

func (ag *agent) unmountRoot() {
	for i := len(ag.mounts) - 1; i >= 0; i-- {
		if err := syscall.Unmount(ag.mounts[i], syscall.MNT_DETACH); err != nil {
			logf("unmounting %s: %v", ag.mounts[i], err)
		}
	}
	ag.mounts = nil
}

// unmountAll unmounts everything but the virtual filesystems, deepest first, so that a VM's disks
// are clean before power off; what cannot be unmounted is remounted read-only.
func unmountAll() {
	targets := mountTargets()
	sort.SliceStable(targets, func(i, j int) bool { return len(targets[i]) > len(targets[j]) })
	for _, t := range targets {
		if t == "/" || t == "/proc" || t == "/sys" || t == "/dev" || strings.HasPrefix(t, "/dev/") ||
			strings.HasPrefix(t, "/sys/") || strings.HasPrefix(t, "/proc/") {
			continue
		}
		if err := syscall.Unmount(t, 0); err != nil {
			syscall.Mount("", t, "", syscall.MS_REMOUNT|syscall.MS_RDONLY, "")
		}
	}
	syscall.Sync()
}

func powerOff() {
	syscall.Sync()
	if err := syscall.Reboot(syscall.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		logf("power off: %v", err)
	}
	if os.Getpid() == 1 {
		select {} // the kernel panics when init exits
	}
}

func memTotal() uint64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "MemTotal:") {
			f := strings.Fields(line)
			if len(f) >= 2 {
				kb, _ := strconv.ParseUint(f[1], 10, 64)
				return kb * 1024
			}
		}
	}
	return 0
}

func cstr(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}

// unameFacts: the kernel release and host name.
func unameFacts() (release, hostname string) {
	var u syscall.Utsname
	syscall.Uname(&u)
	return cstr(u.Release[:]), cstr(u.Nodename[:])
}

// setParentDeathSignal kills a command when the agent dies.
func setParentDeathSignal(attr *syscall.SysProcAttr) {
	attr.Pdeathsig = syscall.SIGKILL
}

// platformRefusal: the serve options this platform cannot honour ("" when none).
func platformRefusal(o options) string {
	return ""
}

// Character-device majors of terminals: BSD ptys (2, 3), consoles and serial ports (4), /dev/tty,
// /dev/console and /dev/ptmx (5), Unix98 pseudo-terminal slaves (136-143).
func ttyMajor(major uint32) bool {
	return major == 2 || major == 3 || major == 4 || major == 5 || (major >= 136 && major <= 143)
}

// isTerminalFd: a terminal's ioctl answers on fd, or fd is a character device with a terminal's major.
func isTerminalFd(fd int) bool {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFCHR {
		return false
	}
	var t syscall.Termios
	if ioctl(uintptr(fd), syscall.TCGETS, unsafe.Pointer(&t)) == nil {
		return true
	}
	major := uint32((st.Rdev>>8)&0xfff) | uint32((st.Rdev>>32)&^0xfff)
	return ttyMajor(major)
}

const fSetPipeSz = 1031 // F_SETPIPE_SZ

// setPipeSize asks the kernel for a pipe buffer of n bytes (best effort: limited by fs.pipe-max-size).
func setPipeSize(f *os.File, n int) {
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	rc.Control(func(fd uintptr) {
		syscall.Syscall(syscall.SYS_FCNTL, fd, fSetPipeSz, uintptr(n))
	})
}

const prSetDumpable = 4

// protectSelf makes the agent not dumpable: the kernel then refuses ptrace attach, process_vm_readv/
// writev, /proc/PID/mem, /proc/PID/fd, pidfd_getfd and kcmp on it to every process without
// CAP_SYS_PTRACE (which no linux_native Machine holds), whatever its uid. The flag belongs to the
// address space, so it covers every thread; execve resets it, which is why the agent sets it itself.
func protectSelf() error {
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetDumpable, 0, 0); errno != 0 {
		return errno
	}
	return nil
}
