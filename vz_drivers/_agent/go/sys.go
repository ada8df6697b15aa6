package main

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
)

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

func (ag *agent) facts() map[string]any {
	release, hostname := unameFacts()
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
		"kernel":        release,
		"hostname":      hostname,
		"root":          ag.root,
		"init":          ag.o.initMode,
		"main_pid":      mainPid,
		"features":      []string{"exec", "logs", "status", "shutdown", "chroot", "pty", "exec_fds", "identity", "services"},
	}
}

// closeOnExecInherited marks every inherited descriptor above stderr close-on-exec, so that
// neither the transport (--fd) nor anything else the agent was given leaks into commands.
func closeOnExecInherited() {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		if entries, err = os.ReadDir("/dev/fd"); err != nil { // darwin
			return
		}
	}
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			syscall.CloseOnExec(fd)
		}
	}
}
