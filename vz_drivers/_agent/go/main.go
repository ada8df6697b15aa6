// Command vz-agent is the vz guest agent: it runs inside a Machine and executes commands for the
// host over one multiplexed byte stream. The protocol is described in docs/agent-protocol.md.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const agentVersion = "0.1.0"

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "vz-agent: "+format+"\n", args...)
}

type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

type options struct {
	listen      string
	device      string
	fd          int
	root        string
	prepareRoot bool
	initMode    bool
	command     []string
	logPath     string
	logMax      int64
	inheritEnv  bool
	env         stringList
	mainUser    string
	mainWorkdir string
	stopTimeout time.Duration
	exitMain    bool
	readyFd     int
	readyVsock  string
	poweroff    bool
	keyFd       int
	keyFromHost bool
	sessions    stringList // more --device ports this agent serves too, one session at a time on each
}

func usage(fs *flag.FlagSet) {
	fmt.Fprintf(os.Stderr, `usage: vz-agent serve (--listen unix:PATH | --listen vsock:PORT | --device PATH | --fd N) [options] [--init [-- CMD ARGS...]]
       vz-agent version

Serves the vz guest agent protocol (docs/agent-protocol.md). With --listen every connection is an
independent session; --device and --fd carry a single session on one byte stream (virtio-serial).

options:
`)
	fs.PrintDefaults()
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: vz-agent serve ... | vz-agent version")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "version", "--version":
		fmt.Printf("vz-agent %s (protocol %d)\n", agentVersion, protocolVersion)
		return
	case "serve":
		// First of all, before anything can reach the agent: no process of the Machine may trace it.
		if err := protectSelf(); err != nil {
			fmt.Fprintf(os.Stderr, "vz-agent: cannot make itself non-dumpable: %v\n", err)
			os.Exit(1)
		}
	default:
		fmt.Fprintf(os.Stderr, "vz-agent: unknown command %q; use serve or version\n", os.Args[1])
		os.Exit(2)
	}
	var o options
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.Usage = func() { usage(fs) }
	fs.StringVar(&o.listen, "listen", "", "listen on `unix:PATH` or vsock:PORT (one session per connection)")
	fs.StringVar(&o.device, "device", "", "serve one session at a time on the character device `PATH` (virtio-serial port)")
	fs.IntVar(&o.fd, "fd", -1, "serve a single session on the inherited file descriptor `N`; exit when it ends")
	fs.StringVar(&o.root, "root", "", "run commands chrooted into `DIR` (the agent itself stays outside)")
	fs.BoolVar(&o.prepareRoot, "prepare-root", false, "mount proc, sys and dev inside --root (and unmount them on exit)")
	fs.BoolVar(&o.initMode, "init", false, "supervise the main process given after -- (or none) as the Machine's init")
	fs.StringVar(&o.logPath, "log", "", "write the main process's stdout+stderr to `FILE` (rotated to FILE.1)")
	fs.Int64Var(&o.logMax, "log-max", 8<<20, "keep at most `BYTES` of main process log (FILE + FILE.1)")
	fs.BoolVar(&o.inheritEnv, "inherit-env", false, "start commands with the agent's own environment as the base")
	fs.Var(&o.env, "env", "add `KEY=VALUE` to the base environment of every command (repeatable)")
	fs.StringVar(&o.mainUser, "main-user", "", "run the main process as `USER` (name or uid[:gid])")
	fs.StringVar(&o.mainWorkdir, "main-workdir", "", "working directory `DIR` of the main process")
	fs.DurationVar(&o.stopTimeout, "stop-timeout", 10*time.Second, "grace between SIGTERM and SIGKILL of the main process")
	fs.BoolVar(&o.exitMain, "exit-with-main", false, "stop the agent (and the Machine) when the main process exits")
	fs.BoolVar(&o.poweroff, "poweroff", false, "run as a VM's init: mount /proc, /sys, /dev if missing; on exit unmount everything and power off")
	fs.IntVar(&o.readyFd, "ready-fd", -1, "write \"ready\\n\" to the inherited file descriptor `N` and close it once serving")
	fs.IntVar(&o.keyFd, "key-fd", -1, "read the per-boot identity key (one line of hex) from the inherited file descriptor `N` at start")
	fs.BoolVar(&o.keyFromHost, "key-from-host", false, "take the identity key from the first HELLO that carries one on a --device port (only the host writes there), on a vsock connection from the host (CID 2) or, with --listen unix:PATH, on any connection (a socket only the host reaches: a stand-in of a vsock port)")
	fs.Var(&o.sessions, "session-device", "serve another session at a time on the character device `PATH` too (repeatable; needs --device): every port is this agent's, so each handshake proves the same identity key")
	fs.StringVar(&o.readyVsock, "ready-vsock", "", "connect to the vsock address `CID:PORT` and write \"ready\\n\" once serving")
	if err := fs.Parse(os.Args[2:]); err != nil {
		os.Exit(2)
	}
	o.command = fs.Args()
	if len(o.command) > 0 && !o.initMode {
		fmt.Fprintln(os.Stderr, "vz-agent: a main command needs --init")
		os.Exit(2)
	}
	n := 0
	for _, set := range []bool{o.listen != "", o.device != "", o.fd >= 0} {
		if set {
			n++
		}
	}
	if n != 1 {
		fmt.Fprintln(os.Stderr, "vz-agent: give exactly one of --listen, --device, --fd")
		os.Exit(2)
	}
	if o.listen != "" && !strings.HasPrefix(o.listen, "unix:") && !strings.HasPrefix(o.listen, "vsock:") {
		fmt.Fprintf(os.Stderr, "vz-agent: --listen %q: only unix:PATH and vsock:PORT are supported\n", o.listen)
		os.Exit(2)
	}
	if strings.HasPrefix(o.listen, "vsock:") {
		if _, err := parseVsockPort(strings.TrimPrefix(o.listen, "vsock:")); err != nil {
			fmt.Fprintf(os.Stderr, "vz-agent: --listen %v\n", err)
			os.Exit(2)
		}
	}
	if o.readyVsock != "" {
		if _, _, err := parseVsockAddr(o.readyVsock); err != nil {
			fmt.Fprintf(os.Stderr, "vz-agent: --ready-vsock %v\n", err)
			os.Exit(2)
		}
	}
	if len(o.sessions) > 0 && o.device == "" {
		fmt.Fprintln(os.Stderr, "vz-agent: --session-device needs --device")
		os.Exit(2)
	}
	if o.keyFromHost && ((o.device == "" && o.listen == "") || o.keyFd >= 0) {
		fmt.Fprintln(os.Stderr, "vz-agent: --key-from-host needs --device or --listen (channels only the host writes to, or whose peer the kernel names) and no --key-fd")
		os.Exit(2)
	}
	if msg := platformRefusal(o); msg != "" {
		fmt.Fprintf(os.Stderr, "vz-agent: %s\n", msg)
		os.Exit(2)
	}
	if o.logMax < 64*1024 {
		fmt.Fprintln(os.Stderr, "vz-agent: --log-max must be at least 65536")
		os.Exit(2)
	}
	for _, kv := range o.env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			fmt.Fprintf(os.Stderr, "vz-agent: --env wants KEY=VALUE, got a value without '=' or with an empty key\n")
			os.Exit(2)
		}
	}
	var key []byte
	if o.keyFd >= 0 {
		k, err := readIdentityKey(o.keyFd)
		if err != nil {
			fmt.Fprintf(os.Stderr, "vz-agent: --key-fd %d: %v\n", o.keyFd, err)
			os.Exit(2)
		}
		key = k
		if o.keyFd != o.readyFd {
			syscall.Close(o.keyFd)
		}
	}
	ag, err := newAgent(o)
	if err == nil {
		ag.key = key
	}
	if err != nil {
		logf("%v", err)
		if o.poweroff {
			powerOff()
		}
		os.Exit(1)
	}
	code := ag.serve()
	if o.poweroff {
		// A VM's init must not exit (the kernel would panic): leave the disks clean and power off,
		// on success and on failure alike.
		unmountAll()
		powerOff()
	}
	os.Exit(code)
}

type mainState struct {
	pid    int
	done   chan struct{}
	status syscall.WaitStatus
}

type agent struct {
	o        options
	root     string
	baseEnv  []string
	reaper   *reaper
	log      *rotLog
	mounts   []string // mounted by --prepare-root, unmounted on exit
	listener net.Listener
	sockPath string
	extra    []*os.File // the --session-device ports, held open (so no other process opens them) while serving
	key      []byte     // the per-boot identity key (--key-fd, --key-from-host); nil when the host gave none; under mu

	mu       sync.Mutex
	sessions map[*session]bool
	main     *mainState
	stopping bool
	services *supervisor

	exitCode chan int
	stopOnce sync.Once
}

func newAgent(o options) (*agent, error) {
	ag := &agent{o: o, reaper: newReaper(), sessions: map[*session]bool{}, exitCode: make(chan int, 1)}
	ag.services = newSupervisor(ag)
	if o.root != "" {
		abs, err := filepath.Abs(o.root)
		if err != nil {
			return nil, err
		}
		if fi, err := os.Stat(abs); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("--root %s is not a directory", o.root)
		}
		ag.root = abs
	}
	if o.inheritEnv {
		ag.baseEnv = append(ag.baseEnv, os.Environ()...)
	}
	ag.baseEnv = append(ag.baseEnv, o.env...)
	if o.logPath != "" {
		l, err := openRotLog(o.logPath, o.logMax)
		if err != nil {
			return nil, fmt.Errorf("opening the log --log %s: %v", o.logPath, err)
		}
		ag.log = l
	}
	return ag, nil
}

func (ag *agent) serve() int {
	closeOnExecInherited()
	if ag.o.poweroff {
		mountEssentials()
	}
	// Orphans of commands are reparented to the agent, so it can kill whole trees and reap them.
	if err := setSubreaper(); err != nil {
		logf("cannot become a child subreaper: %v", err)
	}
	go ag.reaper.run()
	if ag.o.prepareRoot && ag.root != "" {
		if err := ag.mountRoot(); err != nil {
			logf("--prepare-root: %v", err)
			ag.unmountRoot()
			return 1
		}
	}
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	signal.Ignore(syscall.SIGPIPE)
	// The transport first (so that a main process exiting at once finds it), then the main process.
	var stream *os.File
	switch {
	case strings.HasPrefix(ag.o.listen, "vsock:"):
		port, _ := parseVsockPort(strings.TrimPrefix(ag.o.listen, "vsock:"))
		l, err := listenVsock(port)
		if err != nil {
			logf("%v", err)
			ag.unmountRoot()
			return 1
		}
		ag.listener = l
	case ag.o.listen != "":
		if err := ag.listenUnix(strings.TrimPrefix(ag.o.listen, "unix:")); err != nil {
			logf("%v", err)
			ag.unmountRoot()
			return 1
		}
	case ag.o.device != "":
		f, err := os.OpenFile(ag.o.device, os.O_RDWR, 0)
		if err != nil {
			logf("opening %s: %v", ag.o.device, err)
			ag.unmountRoot()
			return 1
		}
		stream = f
		for _, dev := range ag.o.sessions {
			sf, err := os.OpenFile(dev, os.O_RDWR, 0)
			if err != nil {
				logf("opening %s: %v", dev, err)
				ag.unmountRoot()
				return 1
			}
			ag.extra = append(ag.extra, sf)
		}
	default:
		if err := syscall.SetNonblock(ag.o.fd, true); err != nil {
			logf("--fd %d is not an open file descriptor: %v", ag.o.fd, err)
			ag.unmountRoot()
			return 1
		}
		stream = os.NewFile(uintptr(ag.o.fd), "fd"+strconv.Itoa(ag.o.fd))
	}
	if ag.o.initMode && len(ag.o.command) > 0 {
		if err := ag.startMain(); err != nil {
			logf("starting the main process: %v", err)
			ag.stop(0)
			return 1
		}
	}
	switch {
	case ag.listener != nil:
		go ag.acceptLoop()
	default:
		go ag.serveStream(stream, ag.o.device != "", ag.o.device)
		for i, f := range ag.extra {
			go ag.serveStream(f, true, ag.o.sessions[i])
		}
	}
	if ag.o.readyFd >= 0 {
		if f := os.NewFile(uintptr(ag.o.readyFd), "ready"); f != nil {
			f.Write([]byte("ready\n"))
			f.Close()
		}
	}
	if ag.o.readyVsock != "" {
		cid, port, _ := parseVsockAddr(ag.o.readyVsock)
		go readyVsock(cid, port)
	}
	var code int
	select {
	case s := <-sig:
		logf("received %v; stopping", s)
		ag.stop(ag.o.stopTimeout)
		code = <-ag.exitCode
	case code = <-ag.exitCode:
	}
	return code
}

func (ag *agent) listenUnix(path string) error {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		os.Remove(path) // a stale socket of an earlier agent
	}
	addr := path
	if len(path) > 107 {
		dir, err := os.Open(filepath.Dir(path))
		if err != nil {
			return fmt.Errorf("--listen %s: %v", path, err)
		}
		defer dir.Close()
		addr = fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), filepath.Base(path))
	}
	l, err := net.Listen("unix", addr)
	if err != nil {
		return fmt.Errorf("--listen %s: %v", path, err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	ag.listener, ag.sockPath = l, path
	return nil
}

func (ag *agent) acceptLoop() {
	for {
		c, err := ag.listener.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				logf("accept: %v", err)
			}
			return
		}
		s := newSession(ag, c, c, func() { c.Close() }, false)
		if fc, ok := c.(*fileConn); ok {
			s.fromHost = fc.peerCID == vmaddrCidHost // a vsock connection of the host: it may hand over the key
		} else {
			s.fromHost = true // --listen unix: the socket is the host's only (a stand-in of a vsock port)
		}
		go s.run()
	}
}

// serveStream serves sessions on one byte stream. A device (virtio-serial) reads EOF while the
// host is disconnected; the next bytes start a new session. A plain --fd ends the agent at EOF.
func (ag *agent) serveStream(f *os.File, reconnect bool, name string) {
	var pending []byte
	for {
		var r io.Reader = f
		if len(pending) > 0 {
			r = io.MultiReader(strings.NewReader(string(pending)), f)
		}
		s := newSession(ag, r, f, nil, true)
		s.run()
		if !reconnect || ag.isStopping() {
			break
		}
		buf := make([]byte, 4096)
		var lastErr string
		for {
			n, err := f.Read(buf)
			if n > 0 {
				pending = buf[:n]
				break
			}
			if ag.isStopping() {
				return
			}
			if err != nil && err != io.EOF && err.Error() != lastErr {
				lastErr = err.Error()
				logf("reading %s: %v (retrying until a host attaches)", name, err)
			}
			// The port reads EOF until a host connects; there is no event to wait for.
			time.Sleep(50 * time.Millisecond)
		}
	}
	if !ag.isStopping() {
		ag.stop(0)
	}
}

func (ag *agent) isStopping() bool {
	ag.mu.Lock()
	defer ag.mu.Unlock()
	return ag.stopping
}

func (ag *agent) addSession(s *session) {
	ag.mu.Lock()
	ag.sessions[s] = true
	ag.mu.Unlock()
}

func (ag *agent) removeSession(s *session) {
	ag.mu.Lock()
	delete(ag.sessions, s)
	ag.mu.Unlock()
}

func (ag *agent) startMain() error {
	p, serr := ag.prepareCommand(ag.root, ag.o.command, nil, ag.o.mainUser, ag.o.mainWorkdir)
	if serr != nil {
		return errors.New(strings.TrimSpace(serr.msg))
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer devnull.Close()
	var out, logR *os.File
	if ag.log != nil {
		r, w, err := os.Pipe()
		if err != nil {
			return err
		}
		out, logR = w, r
		defer w.Close()
	} else {
		out = os.Stderr
	}
	fd := out.Fd()
	pid, ch, err := ag.spawn(p, []uintptr{devnull.Fd(), fd, fd})
	if err != nil {
		if logR != nil {
			logR.Close()
		}
		return fmt.Errorf("%s: %v", ag.o.command[0], err)
	}
	m := &mainState{pid: pid, done: make(chan struct{})}
	ag.mu.Lock()
	ag.main = m
	ag.mu.Unlock()
	if logR != nil {
		go func() {
			buf := make([]byte, maxData)
			io.CopyBuffer(ag.log, logR, buf)
			logR.Close()
		}()
	}
	go func() {
		m.status = <-ch
		close(m.done)
		code, sig := exitOf(m.status)
		logf("the main process %d exited (code %d%s)", pid, code, map[bool]string{true: ", " + sig, false: ""}[sig != ""])
		if ag.o.exitMain {
			go ag.stop(ag.o.stopTimeout)
		}
	}()
	return nil
}

// stop ends everything: sessions and their execs, the main process (SIGTERM, then SIGKILL after
// grace), every other descendant; then it unmounts what it mounted and posts the exit code.
func (ag *agent) stop(grace time.Duration) {
	ag.stopOnce.Do(func() {
		ag.stopProcesses(grace, nil)
		if ag.listener != nil {
			os.Remove(ag.sockPath)
		}
		ag.unmountRoot()
		syscall.Sync()
		ag.exitCode <- ag.mainExitCode()
	})
}

// stopProcesses is stop without exiting; keep is a session left open (to acknowledge SHUTDOWN).
func (ag *agent) stopProcesses(grace time.Duration, keep *session) {
	ag.mu.Lock()
	ag.stopping = true
	sessions := make([]*session, 0, len(ag.sessions))
	for s := range ag.sessions {
		sessions = append(sessions, s)
	}
	m := ag.main
	ag.mu.Unlock()
	if ag.listener != nil {
		ag.listener.Close()
	}
	for _, s := range sessions {
		if s == keep {
			s.resetStreams()
		} else {
			s.end()
			if s.closeConn != nil {
				s.closeConn()
			}
		}
	}
	// Services first (dependents before what they depend on), each with its own stop timeout.
	ag.services.stopEverything()
	if m != nil {
		select {
		case <-m.done:
		default:
			syscall.Kill(-m.pid, syscall.SIGTERM)
			select {
			case <-m.done:
			case <-time.After(grace):
				logf("the main process did not stop within %v; killing it", grace)
			}
			killTree([]int{m.pid}, m.pid)
		}
	}
	killDescendants(nil)
}

func (ag *agent) mainExitCode() int {
	ag.mu.Lock()
	m := ag.main
	ag.mu.Unlock()
	if m == nil {
		return 0
	}
	select {
	case <-m.done:
		code, _ := exitOf(m.status)
		return code
	default:
		return 0
	}
}

// shutdown serves SHUTDOWN: stop everything, sync, acknowledge, and exit (--poweroff: unmount and
// power off).
func (ag *agent) shutdown(s *session, id uint32, graceMs int64) {
	grace := ag.o.stopTimeout
	if graceMs > 0 {
		grace = time.Duration(graceMs) * time.Millisecond
	}
	ag.stopProcesses(grace, s)
	ag.unmountRoot()
	if ag.o.poweroff {
		unmountAll()
	}
	syscall.Sync()
	s.sendFlushed(outFrame{typ: tShutdownAck, stream: id})
	if ag.listener != nil {
		os.Remove(ag.sockPath)
	}
	ag.stopOnce.Do(func() { ag.exitCode <- ag.mainExitCode() })
}

func (ag *agent) status() map[string]any {
	ag.mu.Lock()
	m := ag.main
	n, sessions := 0, len(ag.sessions)
	all := make([]*session, 0, sessions)
	for s := range ag.sessions {
		all = append(all, s)
	}
	ag.mu.Unlock()
	for _, s := range all {
		n += s.countExecs()
	}
	st := map[string]any{"execs": n, "sessions": sessions, "main_pid": 0, "main_running": false, "main_exited": false,
		"services": len(ag.services.states())}
	if m != nil {
		st["main_pid"] = m.pid
		select {
		case <-m.done:
			code, sig := exitOf(m.status)
			st["main_exited"], st["main_exit_code"], st["main_signal"] = true, code, sig
		default:
			st["main_running"] = true
		}
	}
	return st
}
