package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"unsafe"
)

// Terminal sessions: an exec whose EXEC_START carries "pty" runs on a new pseudo-terminal.
//
// The agent opens /dev/ptmx (posix_openpt), unlocks the terminal side (TIOCSPTLCK) and finds its number
// (TIOCGPTN) with plain ioctls (no cgo), sizes it (TIOCSWINSZ) and starts the command as the leader of a
// new session (setsid) whose controlling terminal is that terminal (TIOCSCTTY), so job control works.
// The terminal's one output stream travels on the STDOUT channel; STDERR ends at once. RESIZE frames set
// the window size (the foreground process group gets SIGWINCH). STDIN_CLOSE means "no more input": the
// terminal stays open. When the leader exits, everything else in its session is killed; a KILL kills the
// whole session.

type ptyRequest struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

type winsize struct {
	rows, cols, xpixel, ypixel uint16
}

func ioctl(fd uintptr, req uintptr, arg unsafe.Pointer) error {
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, fd, req, uintptr(arg)); errno != 0 {
		return errno
	}
	return nil
}

func setWindow(fd uintptr, rows, cols uint16) error {
	ws := winsize{rows: rows, cols: cols}
	return ioctl(fd, syscall.TIOCSWINSZ, unsafe.Pointer(&ws))
}

// openPty returns the descriptors of the master and of the terminal side of a new pseudo-terminal,
// sized rows x cols (0 = 24 x 80), both close-on-exec.
func openPty(rows, cols uint16) (int, int, error) {
	mfd, err := syscall.Open("/dev/ptmx", syscall.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return -1, -1, fmt.Errorf("opening /dev/ptmx: %w", err)
	}
	name, err := ptyName(mfd)
	if err != nil {
		syscall.Close(mfd)
		return -1, -1, err
	}
	sfd, err := syscall.Open(name, syscall.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		syscall.Close(mfd)
		return -1, -1, fmt.Errorf("opening %s: %w", name, err)
	}
	if rows == 0 {
		rows = 24
	}
	if cols == 0 {
		cols = 80
	}
	if err := setWindow(uintptr(sfd), rows, cols); err != nil {
		syscall.Close(mfd)
		syscall.Close(sfd)
		return -1, -1, fmt.Errorf("sizing the pseudo-terminal: %w", err)
	}
	return mfd, sfd, nil
}

// sessionMembers lists the live processes of session sid (zombies excluded).
func sessionMembers(sid int) []int {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	var out []int
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil || pid <= 0 {
			continue
		}
		data, err := os.ReadFile("/proc/" + name + "/stat")
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(data, ')')
		if i < 0 || i+2 >= len(data) {
			continue
		}
		f := bytes.Fields(data[i+2:])
		if len(f) < 4 || f[0][0] == 'Z' {
			continue
		}
		if s, _ := strconv.Atoi(string(f[3])); s == sid {
			out = append(out, pid)
		}
	}
	return out
}

// killSession kills every process of session sid: each one's whole tree (killTree stops them first).
func killSession(sid int) {
	for round := 0; round < 5; round++ {
		members := sessionMembers(sid)
		if len(members) == 0 {
			return
		}
		killTree(members, 0)
		for _, pid := range members {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func (e *execState) resize(payload []byte) {
	if e.ptmx == nil || len(payload) != 4 {
		return
	}
	rows, cols := binary.BigEndian.Uint16(payload[0:2]), binary.BigEndian.Uint16(payload[2:4])
	if rows == 0 || cols == 0 {
		return
	}
	rc, err := e.ptmx.SyscallConn()
	if err != nil {
		return
	}
	rc.Control(func(fd uintptr) { setWindow(fd, rows, cols) })
}

// launchPty starts a prepared command on a new pseudo-terminal (see the top of this file).
func (s *session) launchPty(id uint32, p *prepared, window int64, req *ptyRequest) *setupError {
	mfd, sfd, err := openPty(req.Rows, req.Cols)
	if err != nil {
		return &setupError{code: codeRuntimeFailure, msg: "allocating a pseudo-terminal in the Machine: " + err.Error()}
	}
	// Input goes through a second descriptor of the master, so closing it (STDIN_CLOSE) keeps the terminal
	// open; STDERR is a pipe that ends at once (a terminal has one output stream).
	inFd, err := syscall.Dup(mfd)
	if err != nil {
		syscall.Close(mfd)
		syscall.Close(sfd)
		return &setupError{code: codeRuntimeFailure, msg: "duplicating the pseudo-terminal: " + err.Error()}
	}
	syscall.CloseOnExec(inFd)
	errR, errW, err := os.Pipe()
	if err != nil {
		syscall.Close(mfd)
		syscall.Close(sfd)
		syscall.Close(inFd)
		return &setupError{code: codeRuntimeFailure, msg: "creating pipes: " + err.Error()}
	}
	errW.Close()
	attr := &syscall.ProcAttr{
		Dir:   p.dir,
		Env:   p.env,
		Files: []uintptr{uintptr(sfd), uintptr(sfd), uintptr(sfd)},
		Sys: &syscall.SysProcAttr{
			Setsid:     true,
			Setctty:    true,
			Ctty:       0,
			Chroot:     p.root,
			Credential: p.cred,
		},
	}
	setParentDeathSignal(attr.Sys)
	pid, exitCh, err := s.ag.reaper.start(p.argv0, p.argv, attr)
	syscall.Close(sfd)
	if err != nil {
		syscall.Close(mfd)
		syscall.Close(inFd)
		errR.Close()
		return spawnFailure(p, err)
	}
	// Non-blocking (shared by both descriptors: one open file), so the runtime's poller drives them.
	syscall.SetNonblock(mfd, true)
	master := os.NewFile(uintptr(mfd), "ptmx")
	e := &execState{s: s, id: id, pid: pid, exitCh: exitCh, ptmx: master, stdinW: os.NewFile(uintptr(inFd), "ptmx-in")}
	e.outR[chStdout], e.outR[chStderr] = master, errR
	s.startState(e, window)
	return nil
}
