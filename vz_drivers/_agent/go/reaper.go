package main

import (
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
)

// The agent is a child subreaper and the only caller of wait4: one reaper collects every exit
// (its own children, and orphans reparented to it) and hands the status of registered pids to
// whoever started them. os/exec is never used because its Wait would race with this reaper.
type reaper struct {
	mu        sync.Mutex
	waiters   map[int]chan syscall.WaitStatus
	unclaimed map[int]syscall.WaitStatus // exits seen while a fork was between clone and registration
	forking   int
}

func newReaper() *reaper {
	return &reaper{waiters: map[int]chan syscall.WaitStatus{}, unclaimed: map[int]syscall.WaitStatus{}}
}

func (r *reaper) run() {
	sig := make(chan os.Signal, 64)
	signal.Notify(sig, syscall.SIGCHLD)
	r.reapAll()
	for range sig {
		r.reapAll()
	}
}

func (r *reaper) reapAll() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
		r.mu.Lock()
		if ch, ok := r.waiters[pid]; ok {
			delete(r.waiters, pid)
			ch <- ws
		} else if r.forking > 0 {
			r.unclaimed[pid] = ws
		}
		r.mu.Unlock()
	}
}

// start forks and execs; the returned channel receives the exit status exactly once.
func (r *reaper) start(argv0 string, argv []string, attr *syscall.ProcAttr) (int, <-chan syscall.WaitStatus, error) {
	r.mu.Lock()
	r.forking++
	r.mu.Unlock()
	pid, err := syscall.ForkExec(argv0, argv, attr)
	// The child shares the agent's address space until it execs (vfork), and a credential change there resets
	// the space's dumpable flag to fs.suid_dumpable: clear it again (only suid_dumpable=1 would have set it).
	protectSelf()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forking--
	ch := make(chan syscall.WaitStatus, 1)
	if err == nil {
		if ws, ok := r.unclaimed[pid]; ok {
			delete(r.unclaimed, pid)
			ch <- ws
		} else {
			r.waiters[pid] = ch
		}
	}
	if r.forking == 0 && len(r.unclaimed) > 0 {
		r.unclaimed = map[int]syscall.WaitStatus{}
	}
	if err != nil {
		return 0, nil, err
	}
	return pid, ch, nil
}

func signalName(s syscall.Signal) string {
	if n, ok := signalNames[s]; ok {
		return n
	}
	if s >= 34 && s <= 64 {
		return "SIGRTMIN+" + strconv.Itoa(int(s)-34)
	}
	return "SIG" + strconv.Itoa(int(s))
}

// exitOf maps a wait status to (exit code, signal name); a signal death reports 128+n and the name.
func exitOf(ws syscall.WaitStatus) (int, string) {
	if ws.Signaled() {
		return 128 + int(ws.Signal()), signalName(ws.Signal())
	}
	return ws.ExitStatus(), ""
}
