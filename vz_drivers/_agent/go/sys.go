package main

import (
	"bufio"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

const prSetChildSubreaper = 36

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

func mountTargets() []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 {
			out = append(out, unescapeMount(fields[4]))
		}
	}
	return out
}

func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isMountpoint(p string) bool {
	for _, t := range mountTargets() {
		if t == p {
			return true
		}
	}
	return false
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

func (ag *agent) facts() map[string]any {
	var u syscall.Utsname
	syscall.Uname(&u)
	ag.mu.Lock()
	mainPid := 0
	if ag.main != nil {
		mainPid = ag.main.pid
	}
	ag.mu.Unlock()
	return map[string]any{
		"agent_version": agentVersion,
		"pid":           os.Getpid(),
		"nproc":         runtime.NumCPU(),
		"mem_total":     memTotal(),
		"arch":          runtime.GOARCH,
		"kernel":        cstr(u.Release[:]),
		"hostname":      cstr(u.Nodename[:]),
		"root":          ag.root,
		"init":          ag.o.initMode,
		"main_pid":      mainPid,
		"features":      []string{"exec", "logs", "status", "shutdown", "chroot"},
	}
}

// closeOnExecInherited marks every inherited descriptor above stderr close-on-exec, so that
// neither the transport (--fd) nor anything else the agent was given leaks into commands.
func closeOnExecInherited() {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			syscall.CloseOnExec(fd)
		}
	}
}
