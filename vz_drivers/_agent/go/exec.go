package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

type execRequest struct {
	Argv    []string          `json:"argv"`
	Env     map[string]string `json:"env"`
	User    string            `json:"user"`
	Workdir string            `json:"workdir"`
	Root    *string           `json:"root"`
	Tty     bool              `json:"tty"`
	Pty     *ptyRequest       `json:"pty"`
	Window  int64             `json:"window"`
	// MaxData: the largest output frame of this exec (optional; at most the session's "max_data").
	MaxData int64 `json:"max_data"`
	// StdinWindow: the initial stdin credit of this exec (optional; default defaultWindow).
	StdinWindow int64 `json:"stdin_window"`
}

// streamSizes: the output frame size and the stdin credit an exec asked for, within the session's limits.
func (s *session) streamSizes(req *execRequest) (int, int64) {
	out := maxData
	if req.MaxData > int64(out) {
		out = int(s.maxData)
		if req.MaxData < int64(out) {
			out = int(req.MaxData)
		}
	}
	in := int64(defaultWindow)
	if req.StdinWindow > in {
		in = maxStdinWindow
		if req.StdinWindow < in {
			in = req.StdinWindow
		}
	}
	return out, in
}

// setupError is a failure before the command ran: either an ERROR frame (code != "") or, like a
// shell, a message on stderr and an exit status (127 not found, 126 not executable).
type setupError struct {
	code     string
	msg      string
	exitCode int
}

type prepared struct {
	argv0 string
	argv  []string
	env   []string
	dir   string
	root  string
	cred  *syscall.Credential
}

// prepareCommand resolves user, environment, working directory and executable inside root.
func (ag *agent) prepareCommand(root string, argv []string, env map[string]string, user, workdir string) (*prepared, *setupError) {
	if len(argv) == 0 || argv[0] == "" {
		return nil, &setupError{code: codeInvalidArgument, msg: "argv must be non-empty and argv[0] must not be empty"}
	}
	for i, a := range argv {
		if strings.IndexByte(a, 0) >= 0 {
			return nil, &setupError{code: codeInvalidArgument, msg: fmt.Sprintf("argv[%d] contains a NUL byte", i)}
		}
	}
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return nil, &setupError{code: codeInvalidArgument, msg: fmt.Sprintf("environment variable name %q is invalid (empty, or contains '=' or NUL)", k)}
		}
		if strings.IndexByte(v, 0) >= 0 {
			return nil, &setupError{code: codeInvalidArgument, msg: fmt.Sprintf("the value of environment variable %q contains a NUL byte", k)}
		}
	}
	if root != "" && root != "/" {
		if fi, err := os.Stat(root); err != nil || !fi.IsDir() {
			return nil, &setupError{code: codeFailedPrecondition, msg: fmt.Sprintf("the root directory %q of the Machine is not available", root)}
		}
	}
	id, err := resolveUser(root, user)
	if err != nil {
		return nil, &setupError{code: codeInvalidArgument, msg: err.Error()}
	}
	dir := workdir
	if dir == "" {
		dir = "/"
		if fi, err := statInRoot(root, id.home); err == nil && fi.IsDir() {
			dir = id.home
		}
	} else {
		if !path.IsAbs(dir) {
			return nil, &setupError{code: codeInvalidArgument, msg: fmt.Sprintf("workdir %q must be an absolute path", dir)}
		}
		fi, err := statInRoot(root, dir)
		if err != nil || !fi.IsDir() {
			return nil, &setupError{code: codeInvalidArgument, msg: fmt.Sprintf("workdir %q does not exist in the Machine or is not a directory", dir)}
		}
	}
	envList := ag.buildEnv(id, env)
	pathEnv := defaultPath
	for _, kv := range envList {
		if strings.HasPrefix(kv, "PATH=") {
			pathEnv = kv[5:]
		}
	}
	argv0, err := lookPath(root, argv[0], pathEnv, dir)
	if err != nil {
		if errors.Is(err, syscall.EACCES) {
			return nil, &setupError{exitCode: 126, msg: fmt.Sprintf("vz-agent: %s: permission denied\n", argv[0])}
		}
		if errors.Is(err, errNotFound) {
			return nil, &setupError{exitCode: 127, msg: fmt.Sprintf("vz-agent: %s: executable file not found in $PATH\n", argv[0])}
		}
		return nil, &setupError{exitCode: 127, msg: fmt.Sprintf("vz-agent: %s: no such file or directory\n", argv[0])}
	}
	p := &prepared{argv0: argv0, argv: argv, env: envList, dir: dir, cred: id.credential()}
	if root != "" && root != "/" {
		p.root = root
	}
	return p, nil
}

// buildEnv: the agent's base environment, then HOME/USER/LOGNAME of the user, a default PATH when
// none is set, then the request's variables (which win).
func (ag *agent) buildEnv(id identity, extra map[string]string) []string {
	vals := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, ok := vals[k]; !ok {
			order = append(order, k)
		}
		vals[k] = v
	}
	for _, kv := range ag.baseEnv {
		k, v, _ := strings.Cut(kv, "=")
		set(k, v)
	}
	set("HOME", id.home)
	if id.name != "" {
		set("USER", id.name)
		set("LOGNAME", id.name)
	}
	if _, ok := vals["PATH"]; !ok {
		set("PATH", defaultPath)
	}
	for k, v := range extra {
		set(k, v)
	}
	out := make([]string, 0, len(order))
	for _, k := range order {
		out = append(out, k+"="+vals[k])
	}
	return out
}

// spawn starts a prepared command in its own process group with the given stdio.
func (ag *agent) spawn(p *prepared, files []uintptr) (int, <-chan syscall.WaitStatus, error) {
	attr := &syscall.ProcAttr{
		Dir:   p.dir,
		Env:   p.env,
		Files: files,
		Sys: &syscall.SysProcAttr{
			Setpgid:    true,
			Chroot:     p.root,
			Credential: p.cred,
		},
	}
	setParentDeathSignal(attr.Sys)
	return ag.reaper.start(p.argv0, p.argv, attr)
}

type execState struct {
	s      *session
	id     uint32
	pid    int
	ptmx   *os.File // the pseudo-terminal's master of a terminal session (nil for a plain exec)
	exitCh <-chan syscall.WaitStatus
	stdinW *os.File
	outR   [3]*os.File
	// outMax: the largest output frame (maxData unless agreed wider); inWindow: the stdin credit.
	outMax   int
	inWindow int64

	mu       sync.Mutex
	credCond *sync.Cond
	credit   [3]int64
	killed   bool
	exited   bool
	detached bool // the session abandoned this stream: nothing more may be sent for it
	inCond   *sync.Cond
	inQ      [][]byte
	inBytes  int
	inClosed bool
	inDead   bool
}

func (s *session) startExec(id uint32, payload []byte) {
	if id == 0 {
		s.sendError(0, codeInvalidArgument, "EXEC_START needs a non-zero stream id")
		return
	}
	if s.streamInUse(id) {
		s.sendError(id, codeInvalidArgument, fmt.Sprintf("stream id %d is already in use", id))
		return
	}
	var req execRequest
	if err := json.Unmarshal(payload, &req); err != nil {
		s.sendError(id, codeInvalidArgument, "EXEC_START payload is not valid JSON: "+err.Error())
		return
	}
	if req.Tty {
		s.sendError(id, codeUnsupported, "the guest agent does not run tty execs")
		return
	}
	window := req.Window
	if window <= 0 {
		window = defaultWindow
	}
	root := s.ag.root
	if req.Root != nil {
		root = *req.Root
	}
	outMax, inWindow := s.streamSizes(&req)
	p, serr := s.ag.prepareCommand(root, req.Argv, req.Env, req.User, req.Workdir)
	if serr == nil {
		if err := s.launch(id, p, window, req.Pty, outMax, inWindow); err != nil {
			serr = err
		}
	}
	if serr != nil {
		if serr.code != "" {
			s.sendError(id, serr.code, serr.msg)
		} else {
			s.send(outFrame{typ: tStderr, stream: id, payload: []byte(serr.msg)})
			s.send(outFrame{typ: tExit, stream: id, payload: exitPayload(serr.exitCode, "")})
		}
	}
}

func (s *session) launch(id uint32, p *prepared, window int64, pty *ptyRequest, outMax int, inWindow int64) *setupError {
	if pty != nil {
		return s.launchPty(id, p, window, pty)
	}
	var pipes [6]*os.File // stdin r/w, stdout r/w, stderr r/w
	for i := 0; i < 3; i++ {
		r, w, err := os.Pipe()
		if err != nil {
			for _, f := range pipes {
				if f != nil {
					f.Close()
				}
			}
			return &setupError{code: codeRuntimeFailure, msg: "creating pipes: " + err.Error()}
		}
		pipes[2*i], pipes[2*i+1] = r, w
	}
	if outMax > maxData || inWindow > defaultWindow {
		// Wide frames: pipes that hold a whole frame, so a frame is filled in one read and one write.
		setPipeSize(pipes[1], outMax)
		setPipeSize(pipes[3], outMax)
	}
	// Fd() puts the child's ends in blocking mode, which is what the command expects.
	files := []uintptr{pipes[0].Fd(), pipes[3].Fd(), pipes[5].Fd()}
	pid, exitCh, err := s.ag.spawn(p, files)
	pipes[0].Close()
	pipes[3].Close()
	pipes[5].Close()
	if err != nil {
		pipes[1].Close()
		pipes[2].Close()
		pipes[4].Close()
		return spawnFailure(p, err)
	}
	e := &execState{s: s, id: id, pid: pid, exitCh: exitCh, stdinW: pipes[1], outMax: outMax, inWindow: inWindow}
	e.outR[chStdout], e.outR[chStderr] = pipes[2], pipes[4]
	s.startState(e, window)
	return nil
}

// spawnFailure: what an exec reports when its command could not be started.
func spawnFailure(p *prepared, err error) *setupError {
	{
		switch {
		case errors.Is(err, syscall.ENOENT):
			return &setupError{exitCode: 127, msg: fmt.Sprintf("vz-agent: %s: %v\n", p.argv[0], err)}
		case errors.Is(err, syscall.EACCES):
			// chdir and execve both fail with EACCES in the child; name both candidates.
			return &setupError{exitCode: 126, msg: fmt.Sprintf("vz-agent: %s: permission denied (executing it, or entering the workdir %s)\n", p.argv[0], p.dir)}
		case errors.Is(err, syscall.ENOEXEC):
			return &setupError{exitCode: 126, msg: fmt.Sprintf("vz-agent: %s: %v\n", p.argv[0], err)}
		case errors.Is(err, syscall.EPERM):
			return &setupError{code: codePermissionDenied, msg: "the guest agent may not switch to the requested user: " + err.Error()}
		}
		return &setupError{code: codeRuntimeFailure, msg: fmt.Sprintf("starting %q failed: %v", p.argv[0], err)}
	}
}

// startState registers a started exec and runs it.
func (s *session) startState(e *execState, window int64) {
	id := e.id
	e.credit[chStdout], e.credit[chStderr] = window, window
	e.credCond = sync.NewCond(&e.mu)
	e.inCond = sync.NewCond(&e.mu)
	if !s.register(id, e) { // cannot happen: ids are only added by this goroutine
		e.kill()
	}
	s.send(outFrame{typ: tExecStarted, stream: id, payload: u32Payload(uint32(e.pid))})
	go e.run()
}

func (e *execState) run() {
	var wg sync.WaitGroup
	wg.Add(2)
	go e.pump(chStdout, tStdout, &wg)
	go e.pump(chStderr, tStderr, &wg)
	inDone := make(chan struct{})
	go e.stdinLoop(inDone)

	ws := <-e.exitCh
	e.mu.Lock()
	e.exited = true
	e.credCond.Broadcast()
	e.mu.Unlock()
	if e.ptmx != nil {
		// A terminal session ends with its leader: what else runs in it (background jobs) goes too.
		killSession(e.pid)
	}
	// The command is gone: read what its pipes still hold without waiting for background
	// processes that may keep them open. A past deadline wakes readers blocked in the poller.
	past := time.Unix(1, 0)
	if e.ptmx != nil {
		// A terminal hands over what the command wrote a moment after the write (the kernel pushes it
		// asynchronously), and signals the end with EIO once the session is gone: wait for that, bounded.
		past = time.Now().Add(2 * time.Second)
	}
	e.outR[chStdout].SetReadDeadline(past)
	e.outR[chStderr].SetReadDeadline(past)
	wg.Wait()
	e.outR[chStdout].Close()
	e.outR[chStderr].Close()

	e.mu.Lock()
	e.inDead = true
	e.inCond.Broadcast()
	e.mu.Unlock()
	e.stdinW.Close() // unblocks a write to a pipe nobody reads
	<-inDone

	e.s.unregister(e.id, e)
	code, sig := exitOf(ws)
	e.sendAttached(outFrame{typ: tExit, stream: e.id, payload: exitPayload(code, sig)})
}

// waitCredit returns how much may be read from the pipe of ch now; 0 ends the pump (killed, or
// the command exited and nothing is left in the pipe while the host has granted no credit).
func (e *execState) waitCredit(ch byte) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	for e.credit[ch] <= 0 && !e.killed {
		if e.exited && pipeEmpty(e.outR[ch]) {
			return 0
		}
		e.credCond.Wait()
	}
	if e.killed {
		return 0
	}
	limit := e.outMax
	if limit <= 0 {
		limit = maxData
	}
	if e.credit[ch] > int64(limit) {
		return limit
	}
	return int(e.credit[ch])
}

func (e *execState) isKilled() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.killed
}

func (e *execState) pump(ch byte, typ byte, wg *sync.WaitGroup) {
	defer wg.Done()
	f := e.outR[ch]
	draining := false
	for {
		n := e.waitCredit(ch)
		if n <= 0 {
			return
		}
		bp := getBufSize(n)
		buf := (*bp)[:n]
		var k int
		var err error
		if draining {
			k, err = readNow(f, buf)
		} else {
			k, err = f.Read(buf)
			// A wide frame: take what else the pipe already holds, without waiting for more.
			for err == nil && k > 0 && k < n && n > maxData {
				m, rerr := readNow(f, buf[k:])
				if m <= 0 || rerr != nil {
					break
				}
				k += m
			}
		}
		if k > 0 {
			e.mu.Lock()
			e.credit[ch] -= int64(k)
			e.mu.Unlock()
			if !e.sendAttached(outFrame{typ: typ, stream: e.id, payload: buf[:k], buf: bp}) {
				return
			}
		} else {
			putBuf(bp)
		}
		if err != nil {
			if !draining && errors.Is(err, os.ErrDeadlineExceeded) && !e.isKilled() {
				f.SetReadDeadline(time.Time{})
				draining = true
				continue
			}
			return
		}
	}
}

// readNow reads what is available without waiting (EAGAIN ends the drain).
func readNow(f *os.File, buf []byte) (int, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n int
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		for {
			n, rerr = syscall.Read(int(fd), buf)
			if rerr != syscall.EINTR {
				return true
			}
		}
	})
	if err != nil {
		return 0, err
	}
	if rerr != nil {
		return 0, rerr
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

func (e *execState) addCredit(ch byte, inc uint32) {
	if ch != chStdout && ch != chStderr {
		return
	}
	e.mu.Lock()
	e.credit[ch] += int64(inc)
	e.credCond.Broadcast()
	e.mu.Unlock()
}

func (e *execState) stdin(data []byte) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.inClosed || e.inDead {
		return
	}
	window := e.inWindow
	if window <= 0 {
		window = defaultWindow
	}
	if int64(e.inBytes+len(data)) > window {
		logf("stream %d: the host sent stdin beyond its credit; dropping %d bytes", e.id, len(data))
		return
	}
	e.inQ = append(e.inQ, data)
	e.inBytes += len(data)
	e.inCond.Signal()
}

func (e *execState) stdinClose() {
	e.mu.Lock()
	e.inClosed = true
	e.inCond.Signal()
	e.mu.Unlock()
}

// stdinLoop writes queued stdin to the command and returns the credit to the host as it goes.
// Once the command stops reading (EPIPE), input is discarded but still credited, so the host
// never blocks on an exec that exited early.
func (e *execState) stdinLoop(done chan struct{}) {
	defer close(done)
	defer e.stdinW.Close()
	broken := false
	var pending uint32
	for {
		e.mu.Lock()
		for len(e.inQ) == 0 && !e.inClosed && !e.inDead {
			e.inCond.Wait()
		}
		if e.inDead || len(e.inQ) == 0 {
			e.mu.Unlock()
			return
		}
		chunk := e.inQ[0]
		e.inQ[0] = nil
		e.inQ = e.inQ[1:]
		e.inBytes -= len(chunk)
		more := len(e.inQ) > 0
		e.mu.Unlock()
		if !broken {
			if _, err := e.stdinW.Write(chunk); err != nil {
				broken = true
			}
		}
		pending += uint32(len(chunk))
		releaseStdin(chunk)
		if pending >= 64*1024 || !more {
			e.sendAttached(outFrame{typ: tWindow, stream: e.id, payload: windowPayload(chStdin, pending)})
			pending = 0
		}
	}
}

// sendAttached sends a frame of this stream unless the session abandoned it (a host that
// started over may reuse the id).
func (e *execState) sendAttached(f outFrame) bool {
	e.mu.Lock()
	detached := e.detached
	e.mu.Unlock()
	if detached {
		if f.buf != nil {
			putBuf(f.buf)
		}
		return false
	}
	return e.s.send(f)
}

func (e *execState) abandon() {
	e.mu.Lock()
	e.detached = true
	e.mu.Unlock()
	e.kill()
}

// kill kills the command and all its descendants; EXIT follows once it is reaped.
func (e *execState) kill() {
	e.mu.Lock()
	if e.killed {
		e.mu.Unlock()
		return
	}
	e.killed = true
	e.credCond.Broadcast()
	e.mu.Unlock()
	if e.ptmx != nil {
		go func() {
			killTree([]int{e.pid}, e.pid)
			killSession(e.pid)
		}()
		return
	}
	go killTree([]int{e.pid}, e.pid)
}

// pipeEmpty reports whether nothing is buffered in a pipe (FIONREAD).
func pipeEmpty(f *os.File) bool {
	rc, err := f.SyscallConn()
	if err != nil {
		return true
	}
	n := int32(0)
	var errno syscall.Errno
	rc.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, fionread, uintptr(unsafe.Pointer(&n)))
	})
	return errno != 0 || n == 0
}
