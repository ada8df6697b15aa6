package main

// Services: long-running commands the agent supervises for the Machine (docs/agent-protocol.md,
// "Services"). The host sends the whole set with SERVICES; the agent starts each one when the
// services it depends on are there, restarts it by its policy (with a doubling back-off), checks
// its health, keeps its output in a bounded ring, and stops it (SIGTERM, then SIGKILL after its
// stop timeout) when the set no longer has it or the agent stops. Services belong to the agent,
// not to a session: they outlive the host's connection.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"
)

const (
	defaultServiceLog  = 4 << 20
	maxServiceLog      = 64 << 20
	minBackoff         = 100 * time.Millisecond
	maxBackoff         = 30 * time.Second
	backoffResetAfter  = 10 * time.Second
	maxServices        = 256
	maxServiceLogReply = maxControl - 1024
)

type healthSpec struct {
	Argv          []string `json:"argv,omitempty"`
	TCPPort       int      `json:"tcp_port,omitempty"`
	IntervalMs    int64    `json:"interval_ms"`
	TimeoutMs     int64    `json:"timeout_ms"`
	Retries       int      `json:"retries"`
	StartPeriodMs int64    `json:"start_period_ms"`
}

type serviceSpec struct {
	Name          string            `json:"name"`
	Argv          []string          `json:"argv"`
	Env           map[string]string `json:"env,omitempty"`
	User          string            `json:"user,omitempty"`
	Workdir       string            `json:"workdir,omitempty"`
	Restart       string            `json:"restart,omitempty"` // no | on-failure | always | unless-stopped
	MaxRetries    int               `json:"max_retries,omitempty"`
	Health        *healthSpec       `json:"health,omitempty"`
	DependsOn     map[string]string `json:"depends_on,omitempty"` // name -> service_started | service_healthy | service_completed_successfully
	StopTimeoutMs int64             `json:"stop_timeout_ms,omitempty"`
	LogMax        int               `json:"log_max,omitempty"`
}

type serviceState struct {
	Name         string `json:"name"`
	State        string `json:"state"`  // waiting | running | backoff | exited | failed | stopping | stopped
	Health       string `json:"health"` // "" (no check) | starting | healthy | unhealthy
	Pid          int    `json:"pid"`
	Restarts     int    `json:"restarts"`
	Exited       bool   `json:"exited"` // an exit was seen (LastExitCode/LastSignal are set)
	LastExitCode int    `json:"last_exit_code"`
	LastSignal   string `json:"last_signal"`
	LastError    string `json:"last_error"`
	StartedAt    string `json:"started_at"`
	LogBytes     int64  `json:"log_bytes"`
}

// ring is a bounded log: the newest max bytes, and how many were written in all.
type ring struct {
	mu    sync.Mutex
	buf   []byte
	max   int
	total int64
}

func (r *ring) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.total += int64(len(p))
	if len(p) >= r.max {
		r.buf = append(r.buf[:0], p[len(p)-r.max:]...)
		return len(p), nil
	}
	if over := len(r.buf) + len(p) - r.max; over > 0 {
		r.buf = append(r.buf[:0], r.buf[over:]...)
	}
	r.buf = append(r.buf, p...)
	return len(p), nil
}

func (r *ring) tail(n int) ([]byte, int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.buf
	if n >= 0 && len(b) > n {
		b = b[len(b)-n:]
	}
	return append([]byte(nil), b...), r.total
}

type service struct {
	spec    serviceSpec
	specKey string
	log     *ring
	st      serviceState
	stop    chan struct{} // closed to stop the service for good
	done    chan struct{} // closed once its supervisor returned (the process is gone)
	stopped bool
}

type supervisor struct {
	ag       *agent
	setMu    sync.Mutex // one SERVICES at a time (several sessions may send one)
	mu       sync.Mutex
	services map[string]*service
	order    []string         // the set's names in start (dependency) order
	changed  chan struct{}    // closed and replaced on every state change
	logs     map[string]*ring // kept across restarts and changes of a service
}

func newSupervisor(ag *agent) *supervisor {
	return &supervisor{ag: ag, services: map[string]*service{}, changed: make(chan struct{}), logs: map[string]*ring{}}
}

// notify wakes everyone waiting for a state change; call with mu held.
func (sv *supervisor) notify() {
	close(sv.changed)
	sv.changed = make(chan struct{})
}

// validateServices checks a whole set before anything changes; the error names the service.
func validateServices(specs []serviceSpec) ([]string, error) {
	if len(specs) > maxServices {
		return nil, fmt.Errorf("at most %d services, got %d", maxServices, len(specs))
	}
	byName := map[string]*serviceSpec{}
	for i := range specs {
		s := &specs[i]
		if s.Name == "" {
			return nil, fmt.Errorf("services[%d]: name is empty", i)
		}
		if _, dup := byName[s.Name]; dup {
			return nil, fmt.Errorf("service %q is given twice", s.Name)
		}
		byName[s.Name] = s
		if len(s.Argv) == 0 || s.Argv[0] == "" {
			return nil, fmt.Errorf("service %q: argv must be non-empty", s.Name)
		}
		switch s.Restart {
		case "", "no", "on-failure", "always", "unless-stopped":
		default:
			return nil, fmt.Errorf("service %q: restart %q is not one of no, on-failure, always, unless-stopped", s.Name, s.Restart)
		}
		if s.MaxRetries < 0 {
			return nil, fmt.Errorf("service %q: max_retries must not be negative", s.Name)
		}
		if s.StopTimeoutMs < 0 {
			return nil, fmt.Errorf("service %q: stop_timeout_ms must not be negative", s.Name)
		}
		if s.LogMax < 0 || s.LogMax > maxServiceLog {
			return nil, fmt.Errorf("service %q: log_max must be 0..%d", s.Name, maxServiceLog)
		}
		if h := s.Health; h != nil {
			if (len(h.Argv) == 0) == (h.TCPPort == 0) {
				return nil, fmt.Errorf("service %q: health needs exactly one of argv and tcp_port", s.Name)
			}
			if h.TCPPort < 0 || h.TCPPort > 65535 {
				return nil, fmt.Errorf("service %q: health tcp_port %d is not 1..65535", s.Name, h.TCPPort)
			}
			if h.IntervalMs < 0 || h.TimeoutMs < 0 || h.Retries < 0 || h.StartPeriodMs < 0 {
				return nil, fmt.Errorf("service %q: health interval, timeout, retries and start period must not be negative", s.Name)
			}
		}
	}
	for _, s := range specs {
		for dep, cond := range s.DependsOn {
			d, ok := byName[dep]
			if !ok {
				return nil, fmt.Errorf("service %q depends on %q, which is not in the set", s.Name, dep)
			}
			switch cond {
			case "service_started", "service_completed_successfully":
			case "service_healthy":
				if d.Health == nil {
					return nil, fmt.Errorf("service %q waits for %q to be healthy, but %q has no health check", s.Name, dep, dep)
				}
			default:
				return nil, fmt.Errorf("service %q: depends_on %q condition %q is not service_started, service_healthy or service_completed_successfully", s.Name, dep, cond)
			}
		}
	}
	// Topological order (Kahn, names sorted for a stable result); a leftover is a cycle.
	indeg := map[string]int{}
	users := map[string][]string{}
	for _, s := range specs {
		indeg[s.Name] += 0
		for dep := range s.DependsOn {
			indeg[s.Name]++
			users[dep] = append(users[dep], s.Name)
		}
	}
	var ready, order []string
	for n, d := range indeg {
		if d == 0 {
			ready = append(ready, n)
		}
	}
	sort.Strings(ready)
	for len(ready) > 0 {
		n := ready[0]
		ready = ready[1:]
		order = append(order, n)
		next := users[n]
		sort.Strings(next)
		for _, u := range next {
			indeg[u]--
			if indeg[u] == 0 {
				ready = append(ready, u)
			}
		}
	}
	if len(order) != len(specs) {
		var cyc []string
		for n, d := range indeg {
			if d > 0 {
				cyc = append(cyc, n)
			}
		}
		sort.Strings(cyc)
		return nil, fmt.Errorf("depends_on has a cycle among %v", cyc)
	}
	return order, nil
}

// set replaces the service set: services no longer in it (or whose spec changed) are stopped,
// new and changed ones are started; unchanged ones keep running untouched.
func (sv *supervisor) set(specs []serviceSpec) error {
	sv.setMu.Lock()
	defer sv.setMu.Unlock()
	order, err := validateServices(specs)
	if err != nil {
		return err
	}
	for i := range specs {
		if _, serr := sv.ag.prepareCommand(sv.ag.root, specs[i].Argv, specs[i].Env, specs[i].User, specs[i].Workdir); serr != nil && serr.code != "" {
			return fmt.Errorf("service %q: %s", specs[i].Name, serr.msg)
		}
	}
	sv.ag.mu.Lock()
	stopping := sv.ag.stopping
	sv.ag.mu.Unlock()
	if stopping {
		return fmt.Errorf("the agent is stopping")
	}
	want := map[string]serviceSpec{}
	keys := map[string]string{}
	for _, s := range specs {
		b, _ := json.Marshal(s)
		want[s.Name], keys[s.Name] = s, string(b)
	}
	sv.mu.Lock()
	var gone []*service
	for name, s := range sv.services {
		if k, ok := keys[name]; !ok || k != s.specKey {
			gone = append(gone, s)
			delete(sv.services, name)
		}
	}
	sv.mu.Unlock()
	sv.stopAll(gone)
	sv.mu.Lock()
	defer sv.mu.Unlock()
	sv.order = order
	for _, name := range order {
		if _, ok := sv.services[name]; ok {
			continue
		}
		spec := want[name]
		max := spec.LogMax
		if max == 0 {
			max = defaultServiceLog
		}
		lg := sv.logs[name]
		if lg == nil || lg.max != max {
			lg = &ring{max: max}
			if old := sv.logs[name]; old != nil {
				b, _ := old.tail(max)
				lg.Write(b)
			}
			sv.logs[name] = lg
		}
		s := &service{spec: spec, specKey: keys[name], log: lg, stop: make(chan struct{}), done: make(chan struct{})}
		s.st = serviceState{Name: name, State: "waiting"}
		if spec.Health != nil {
			s.st.Health = "starting"
		}
		sv.services[name] = s
		go sv.supervise(s)
	}
	for name := range sv.logs {
		if _, ok := want[name]; !ok {
			delete(sv.logs, name)
		}
	}
	sv.notify()
	return nil
}

// stopAll stops services, dependents before what they depend on, and waits for them.
func (sv *supervisor) stopAll(list []*service) {
	if len(list) == 0 {
		return
	}
	sv.mu.Lock()
	pos := map[string]int{}
	for i, n := range sv.order {
		pos[n] = i
	}
	sv.mu.Unlock()
	sort.SliceStable(list, func(i, j int) bool { return pos[list[i].spec.Name] > pos[list[j].spec.Name] })
	for _, s := range list {
		sv.mu.Lock()
		if !s.stopped {
			s.stopped = true
			close(s.stop)
		}
		sv.mu.Unlock()
		<-s.done
	}
}

// stopEverything stops every service (the agent is stopping).
func (sv *supervisor) stopEverything() {
	sv.mu.Lock()
	list := make([]*service, 0, len(sv.services))
	for _, s := range sv.services {
		list = append(list, s)
	}
	sv.mu.Unlock()
	sv.stopAll(list)
}

func (sv *supervisor) states() []serviceState {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	out := make([]serviceState, 0, len(sv.services))
	for _, name := range sv.order {
		if s, ok := sv.services[name]; ok {
			st := s.st
			_, st.LogBytes = s.log.tail(0)
			out = append(out, st)
		}
	}
	return out
}

func (sv *supervisor) logTail(name string, n int) ([]byte, int64, bool) {
	sv.mu.Lock()
	lg := sv.logs[name]
	sv.mu.Unlock()
	if lg == nil {
		return nil, 0, false
	}
	if n <= 0 || n > maxServiceLogReply {
		n = maxServiceLogReply
	}
	b, total := lg.tail(n)
	return b, total, true
}

func (sv *supervisor) update(s *service, f func(st *serviceState)) {
	sv.mu.Lock()
	f(&s.st)
	sv.notify()
	sv.mu.Unlock()
}

// depsMet: whether every dependency of s is in the state it waits for; a dependency that can never
// get there (exited for good, failed) is reported as the reason.
func (sv *supervisor) depsMet(s *service) (bool, string) {
	for dep, cond := range s.spec.DependsOn {
		d := sv.services[dep]
		if d == nil {
			return false, ""
		}
		switch cond {
		case "service_started":
			if d.st.State != "running" {
				return false, ""
			}
		case "service_healthy":
			if d.st.Health != "healthy" {
				return false, ""
			}
		case "service_completed_successfully":
			if d.st.State == "exited" && d.st.LastExitCode == 0 && d.st.LastSignal == "" {
				continue
			}
			if d.st.State == "exited" || d.st.State == "failed" {
				return false, fmt.Sprintf("%q did not complete successfully", dep)
			}
			return false, ""
		}
	}
	return true, ""
}

func sleepOrStop(d time.Duration, stop <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-stop:
		return false
	}
}

func (sv *supervisor) supervise(s *service) {
	defer close(s.done)
	defer sv.update(s, func(st *serviceState) { st.State, st.Pid = "stopped", 0 })
	backoff := minBackoff
	for {
		// Wait for the dependencies.
		for {
			sv.mu.Lock()
			ok, why := sv.depsMet(s)
			ch := sv.changed
			if !ok && why != "" {
				s.st.LastError = "waiting: " + why
			}
			sv.mu.Unlock()
			if ok {
				break
			}
			select {
			case <-ch:
			case <-s.stop:
				return
			}
		}
		started := time.Now()
		pid, exit, err := sv.startProcess(s)
		if err != nil {
			sv.update(s, func(st *serviceState) {
				st.State, st.LastError, st.Pid = "failed", err.Error(), 0
				st.Exited, st.LastExitCode, st.LastSignal = true, 127, ""
			})
			fmt.Fprintf(s.log, "vz-agent: service %s: %v\n", s.spec.Name, err)
		} else {
			sv.update(s, func(st *serviceState) {
				st.State, st.Pid, st.LastError = "running", pid, ""
				st.StartedAt = started.UTC().Format(time.RFC3339Nano)
				if s.spec.Health != nil {
					st.Health = "starting"
				}
			})
			runDone := make(chan struct{})
			if s.spec.Health != nil {
				go sv.checkHealth(s, runDone)
			}
			var ws syscall.WaitStatus
			select {
			case ws = <-exit:
			case <-s.stop:
				sv.update(s, func(st *serviceState) { st.State = "stopping" })
				ws = sv.terminate(s, pid, exit)
				close(runDone)
				code, sig := exitOf(ws)
				sv.update(s, func(st *serviceState) {
					st.Exited, st.LastExitCode, st.LastSignal = true, code, sig
				})
				return
			}
			close(runDone)
			// What is left of the group (daemons it forked) goes with it.
			killTree([]int{pid}, pid)
			code, sig := exitOf(ws)
			fmt.Fprintf(s.log, "vz-agent: service %s exited (code %d%s)\n", s.spec.Name, code, map[bool]string{true: ", " + sig, false: ""}[sig != ""])
			sv.update(s, func(st *serviceState) {
				st.State, st.Pid = "exited", 0
				st.Exited, st.LastExitCode, st.LastSignal = true, code, sig
				if s.spec.Health != nil {
					st.Health = "unhealthy"
				}
			})
		}
		sv.mu.Lock()
		st := s.st
		sv.mu.Unlock()
		failed := st.State == "failed" || st.LastExitCode != 0 || st.LastSignal != ""
		restart := false
		switch s.spec.Restart {
		case "always", "unless-stopped":
			restart = true
		case "on-failure":
			restart = failed && (s.spec.MaxRetries == 0 || st.Restarts < s.spec.MaxRetries)
		}
		if !restart {
			if st.State != "failed" && failed && s.spec.Restart == "on-failure" {
				sv.update(s, func(st *serviceState) {
					st.State = "failed"
					st.LastError = "gave up after " + strconv.Itoa(st.Restarts) + " restarts"
				})
			}
			<-s.stop
			return
		}
		if time.Since(started) >= backoffResetAfter {
			backoff = minBackoff
		}
		sv.update(s, func(st *serviceState) { st.State = "backoff" })
		if !sleepOrStop(backoff, s.stop) {
			return
		}
		backoff *= 2
		if backoff > maxBackoff {
			backoff = maxBackoff
		}
		sv.update(s, func(st *serviceState) { st.Restarts++ })
	}
}

func (sv *supervisor) startProcess(s *service) (int, <-chan syscall.WaitStatus, error) {
	p, serr := sv.ag.prepareCommand(sv.ag.root, s.spec.Argv, s.spec.Env, s.spec.User, s.spec.Workdir)
	if serr != nil {
		return 0, nil, fmt.Errorf("%s", bytes.TrimSpace([]byte(serr.msg)))
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return 0, nil, err
	}
	defer devnull.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return 0, nil, err
	}
	pid, ch, err := sv.ag.spawn(p, []uintptr{devnull.Fd(), w.Fd(), w.Fd()})
	w.Close()
	if err != nil {
		r.Close()
		return 0, nil, fmt.Errorf("%s: %v", s.spec.Argv[0], err)
	}
	go func() {
		buf := make([]byte, 32*1024)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				s.log.Write(buf[:n])
			}
			if err != nil {
				break
			}
		}
		r.Close()
	}()
	return pid, ch, nil
}

// terminate: SIGTERM to the service's group, SIGKILL of the whole tree after its stop timeout.
func (sv *supervisor) terminate(s *service, pid int, exit <-chan syscall.WaitStatus) syscall.WaitStatus {
	grace := sv.ag.o.stopTimeout
	if s.spec.StopTimeoutMs > 0 {
		grace = time.Duration(s.spec.StopTimeoutMs) * time.Millisecond
	}
	syscall.Kill(-pid, syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case ws := <-exit:
		killTree([]int{pid}, pid)
		return ws
	case <-t.C:
		fmt.Fprintf(s.log, "vz-agent: service %s did not stop within %v of SIGTERM; killing it\n", s.spec.Name, grace)
		killTree([]int{pid}, pid)
		return <-exit
	}
}

func msOr(v int64, def time.Duration) time.Duration {
	if v <= 0 {
		return def
	}
	return time.Duration(v) * time.Millisecond
}

// checkHealth runs the health check every interval while the process runs (Compose semantics:
// failures inside the start period do not count; a success there makes the service healthy).
func (sv *supervisor) checkHealth(s *service, runDone <-chan struct{}) {
	h := s.spec.Health
	interval := msOr(h.IntervalMs, 30*time.Second)
	timeout := msOr(h.TimeoutMs, 30*time.Second)
	retries := h.Retries
	if retries == 0 {
		retries = 3
	}
	startPeriod := msOr(h.StartPeriodMs, 0)
	began := time.Now()
	failures := 0
	wait := time.Duration(0)
	if interval > time.Second {
		wait = time.Second // the first check comes soon, so dependents need not wait a whole interval
	}
	for {
		if !sleepOrStop(wait, runDone) {
			return
		}
		wait = interval
		ok, why := sv.probe(s, h, timeout, runDone)
		select {
		case <-runDone:
			return
		default:
		}
		sv.update(s, func(st *serviceState) {
			select {
			case <-runDone: // the run ended meanwhile: its exit decides the health now
				return
			default:
			}
			if ok {
				failures = 0
				st.Health = "healthy"
				return
			}
			if time.Since(began) < startPeriod {
				return
			}
			failures++
			if failures >= retries {
				st.Health = "unhealthy"
				st.LastError = "health check: " + why
			}
		})
	}
}

func (sv *supervisor) probe(s *service, h *healthSpec, timeout time.Duration, runDone <-chan struct{}) (bool, string) {
	if h.TCPPort != 0 {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(h.TCPPort), timeout)
		if err != nil {
			return false, err.Error()
		}
		c.Close()
		return true, ""
	}
	p, serr := sv.ag.prepareCommand(sv.ag.root, h.Argv, s.spec.Env, s.spec.User, s.spec.Workdir)
	if serr != nil {
		return false, string(bytes.TrimSpace([]byte(serr.msg)))
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return false, err.Error()
	}
	pid, ch, err := sv.ag.spawn(p, []uintptr{devnull.Fd(), devnull.Fd(), devnull.Fd()})
	devnull.Close()
	if err != nil {
		return false, err.Error()
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case ws := <-ch:
		killTree([]int{pid}, pid)
		if code, sig := exitOf(ws); code != 0 || sig != "" {
			return false, fmt.Sprintf("%s exited with code %d", h.Argv[0], code)
		}
		return true, ""
	case <-t.C:
		killTree([]int{pid}, pid)
		<-ch
		return false, fmt.Sprintf("%s did not finish within %v", h.Argv[0], timeout)
	case <-runDone:
		killTree([]int{pid}, pid)
		<-ch
		return false, "the service stopped"
	}
}

// Frame handlers (session side).

func (s *session) handleServices(id uint32, payload []byte) {
	var req struct {
		Services []serviceSpec `json:"services"`
	}
	if err := json.Unmarshal(payload, &req); err != nil {
		s.sendError(id, codeInvalidArgument, "SERVICES payload is not valid JSON: "+err.Error())
		return
	}
	go func() {
		if err := s.ag.services.set(req.Services); err != nil {
			s.sendError(id, codeInvalidArgument, err.Error())
			return
		}
		b, _ := json.Marshal(map[string]any{"services": s.ag.services.states()})
		s.send(outFrame{typ: tServicesReply, stream: id, payload: b})
	}()
}

func (s *session) handleServiceStates(id uint32) {
	b, _ := json.Marshal(map[string]any{"services": s.ag.services.states()})
	s.send(outFrame{typ: tServiceStatesReply, stream: id, payload: b})
}

func (s *session) handleServiceLogs(id uint32, payload []byte) {
	var req struct {
		Name      string `json:"name"`
		TailBytes int    `json:"tail_bytes"`
	}
	if err := json.Unmarshal(payload, &req); err != nil {
		s.sendError(id, codeInvalidArgument, "SERVICE_LOGS payload is not valid JSON: "+err.Error())
		return
	}
	b, _, ok := s.ag.services.logTail(req.Name, req.TailBytes)
	if !ok {
		s.sendError(id, codeInvalidArgument, fmt.Sprintf("no service %q in this Machine", req.Name))
		return
	}
	s.send(outFrame{typ: tServiceLogsReply, stream: id, payload: b})
}
