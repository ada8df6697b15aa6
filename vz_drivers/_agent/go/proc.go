package main

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
	"time"
)

type procEntry struct {
	pid, ppid, pgid int
	start           uint64 // starttime in clock ticks: with pid, the identity of a process
}

// scanProcs lists every process visible in /proc.
func scanProcs() []procEntry {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	out := make([]procEntry, 0, len(names))
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil || pid <= 0 {
			continue
		}
		if e, ok := readStat(pid); ok {
			out = append(out, e)
		}
	}
	return out
}

func readStat(pid int) (procEntry, bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procEntry{}, false
	}
	// The command name may hold spaces and parentheses: fields start after the last ')'.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 || i+2 >= len(data) {
		return procEntry{}, false
	}
	f := bytes.Fields(data[i+2:])
	// f[0]=state f[1]=ppid f[2]=pgrp ... f[19]=starttime
	if len(f) < 20 {
		return procEntry{}, false
	}
	ppid, _ := strconv.Atoi(string(f[1]))
	pgid, _ := strconv.Atoi(string(f[2]))
	start, _ := strconv.ParseUint(string(f[19]), 10, 64)
	return procEntry{pid: pid, ppid: ppid, pgid: pgid, start: start}, true
}

// signalIfSame signals pid only if it is still the process identified by start.
func signalIfSame(pid int, start uint64, sig syscall.Signal) {
	if e, ok := readStat(pid); ok && e.start == start {
		syscall.Kill(pid, sig)
	}
}

// killTree kills a process tree: the process group pgid, the descendants of the roots, and (for
// those already reparented to the agent) everything that was ever seen in the tree. It first
// stops the tree with SIGSTOP until no new member appears (so nothing forks away mid-kill), then
// sends SIGKILL to every member. roots may be empty when only a group is to be killed.
func killTree(roots []int, pgid int) {
	self := os.Getpid()
	members := map[int]uint64{}
	for _, r := range roots {
		if e, ok := readStat(r); ok {
			members[r] = e.start
		}
	}
	for round := 0; round < 50; round++ {
		if pgid > 0 {
			syscall.Kill(-pgid, syscall.SIGSTOP)
		}
		grew := false
		procs := scanProcs()
		for changed := true; changed; {
			changed = false
			for _, p := range procs {
				if p.pid == self || p.pid == 1 {
					continue
				}
				if _, ok := members[p.pid]; ok {
					continue
				}
				_, parentIn := members[p.ppid]
				if (pgid > 0 && p.pgid == pgid) || parentIn {
					members[p.pid] = p.start
					changed, grew = true, true
				}
			}
		}
		for pid, start := range members {
			signalIfSame(pid, start, syscall.SIGSTOP)
		}
		if !grew && round > 0 {
			break
		}
	}
	if pgid > 0 {
		syscall.Kill(-pgid, syscall.SIGKILL)
	}
	for pid, start := range members {
		signalIfSame(pid, start, syscall.SIGKILL)
	}
}

// killDescendants kills every descendant of the agent except the process trees in keep.
func killDescendants(keep map[int]bool) {
	self := os.Getpid()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		var roots []int
		for _, p := range scanProcs() {
			if p.ppid == self && !keep[p.pid] {
				if st, err := os.ReadFile("/proc/" + strconv.Itoa(p.pid) + "/stat"); err == nil && isZombie(st) {
					continue
				}
				roots = append(roots, p.pid)
			}
		}
		if len(roots) == 0 {
			return
		}
		killTree(roots, 0)
		time.Sleep(20 * time.Millisecond) // let the reaper collect them before looking again
	}
}

func isZombie(stat []byte) bool {
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}
