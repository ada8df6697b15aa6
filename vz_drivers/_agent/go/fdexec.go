package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
)

// EXEC_FDS: an exec whose stdin, stdout and stderr are three descriptors the host passed with the
// request (SCM_RIGHTS on a Unix socket connection). The command gets exactly those descriptors: no
// pipes, no STDIN/STDOUT/STDERR frames, nothing copied by the agent. See docs/agent-protocol.md.

const maxQueuedFds = 48

var errCtrunc = errors.New("the host passed more descriptors than one read can carry")

// fdReader reads a Unix socket connection with recvmsg and keeps the descriptors that arrive, in
// order, until a request takes them (or the session ends and closes them).
type fdReader struct {
	c   *net.UnixConn
	oob []byte

	mu  sync.Mutex
	fds []int
}

func newFdReader(c *net.UnixConn) *fdReader {
	return &fdReader{c: c, oob: make([]byte, syscall.CmsgSpace(4*16))}
}

func (r *fdReader) Read(p []byte) (int, error) {
	n, oobn, flags, _, err := r.c.ReadMsgUnix(p, r.oob)
	if n < 0 { // a failed recvmsg (a closed connection) may report -1
		n = 0
	}
	if oobn > 0 {
		r.keep(r.oob[:oobn])
	}
	if flags&syscall.MSG_CTRUNC != 0 {
		return n, errCtrunc
	}
	return n, err
}

func (r *fdReader) keep(oob []byte) {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range msgs {
		fds, err := syscall.ParseUnixRights(&msgs[i])
		if err != nil {
			continue
		}
		for _, fd := range fds {
			syscall.CloseOnExec(fd) // never inherited by a command started meanwhile
			if len(r.fds) >= maxQueuedFds {
				syscall.Close(fd)
				continue
			}
			r.fds = append(r.fds, fd)
		}
	}
}

// take removes the n oldest descriptors; false (and nothing taken) when fewer arrived.
func (r *fdReader) take(n int) ([]int, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.fds) < n {
		return nil, false
	}
	out := append([]int(nil), r.fds[:n]...)
	r.fds = r.fds[n:]
	return out, true
}

func (r *fdReader) closeAll() {
	r.mu.Lock()
	fds := r.fds
	r.fds = nil
	r.mu.Unlock()
	for _, fd := range fds {
		syscall.Close(fd)
	}
}

type fdExecRequest struct {
	execRequest
	Fds int `json:"fds"`
}

var stdioNames = [3]string{"stdin", "stdout", "stderr"}

func closeFds(fds []int) {
	for _, fd := range fds {
		if fd >= 0 {
			syscall.Close(fd)
		}
	}
}

func (s *session) startExecFds(id uint32, payload []byte) {
	// The descriptors travel with the request: take them first, so that every way out closes them.
	var fds []int
	if s.fds != nil {
		fds, _ = s.fds.take(3)
	}
	defer func() { closeFds(fds) }()
	if id == 0 {
		s.sendError(0, codeInvalidArgument, "EXEC_FDS needs a non-zero stream id")
		return
	}
	if s.streamInUse(id) {
		s.sendError(id, codeInvalidArgument, fmt.Sprintf("stream id %d is already in use", id))
		return
	}
	if s.fds == nil {
		s.sendError(id, codeUnsupported, "descriptors can only be passed over a Unix socket connection; use EXEC_START")
		return
	}
	var req fdExecRequest
	if err := json.Unmarshal(payload, &req); err != nil {
		s.sendError(id, codeInvalidArgument, "EXEC_FDS payload is not valid JSON: "+err.Error())
		return
	}
	if req.Fds != 3 || fds == nil {
		s.sendError(id, codeInvalidArgument, "EXEC_FDS must say \"fds\": 3 and carry exactly three descriptors (stdin, stdout, stderr) as SCM_RIGHTS")
		return
	}
	if req.Tty || req.Pty != nil {
		s.sendError(id, codeUnsupported, "EXEC_FDS runs commands without a terminal; use EXEC_START with pty")
		return
	}
	for i, fd := range fds {
		if isTerminalFd(fd) {
			s.sendError(id, codeInvalidArgument, fmt.Sprintf(
				"the %s descriptor is a terminal; a terminal is never passed into a Machine (copy its bytes with EXEC_START)", stdioNames[i]))
			return
		}
	}
	root := s.ag.root
	if req.Root != nil {
		root = *req.Root
	}
	p, serr := s.ag.prepareCommand(root, req.Argv, req.Env, req.User, req.Workdir)
	if serr == nil {
		pid, exitCh, err := s.ag.spawn(p, []uintptr{uintptr(fds[0]), uintptr(fds[1]), uintptr(fds[2])})
		if err == nil {
			e := &fdExec{s: s, id: id, pid: pid, exitCh: exitCh}
			if !s.register(id, e) {
				e.kill()
			}
			s.send(outFrame{typ: tExecStarted, stream: id, payload: u32Payload(uint32(pid))})
			go e.run()
			return
		}
		serr = spawnFailure(p, err)
	}
	if serr.code != "" {
		s.sendError(id, serr.code, serr.msg)
		return
	}
	// Like a shell: the message on the command's stderr, then the exit status. The write may wait for
	// a slow reader: not on the session's reader goroutine.
	stderr := fds[2]
	fds[2] = -1
	go func() {
		syscall.Write(stderr, []byte(serr.msg))
		syscall.Close(stderr)
		s.send(outFrame{typ: tExit, stream: id, payload: exitPayload(serr.exitCode, "")})
	}()
}

// fdExec is a running EXEC_FDS command: it has no data channels, only KILL and its EXIT.
type fdExec struct {
	s      *session
	id     uint32
	pid    int
	exitCh <-chan syscall.WaitStatus

	mu       sync.Mutex
	killed   bool
	detached bool
}

func (e *fdExec) addCredit(ch byte, inc uint32) {}
func (e *fdExec) stdin(data []byte)             {}
func (e *fdExec) stdinClose()                   {}

func (e *fdExec) kill() {
	e.mu.Lock()
	if e.killed {
		e.mu.Unlock()
		return
	}
	e.killed = true
	e.mu.Unlock()
	go killTree([]int{e.pid}, e.pid)
}

func (e *fdExec) abandon() {
	e.mu.Lock()
	e.detached = true
	e.mu.Unlock()
	e.kill()
}

func (e *fdExec) run() {
	ws := <-e.exitCh
	e.s.unregister(e.id, e)
	code, sig := exitOf(ws)
	e.mu.Lock()
	detached := e.detached
	e.mu.Unlock()
	if !detached {
		e.s.send(outFrame{typ: tExit, stream: e.id, payload: exitPayload(code, sig)})
	}
}
