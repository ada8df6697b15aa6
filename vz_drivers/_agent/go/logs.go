package main

import (
	"encoding/json"
	"io"
	"os"
	"sync"
)

// rotLog is the main process's bounded log: FILE holds the newest output, FILE.1 the previous
// half. Each holds at most max/2 bytes, so both together never exceed max; the oldest output is
// dropped first. Readers see FILE.1 followed by FILE.
type rotLog struct {
	mu   sync.Mutex
	path string
	max  int64
	f    *os.File
	size int64
}

func openRotLog(path string, max int64) (*rotLog, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &rotLog{path: path, max: max, f: f, size: fi.Size()}, nil
}

func (l *rotLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	half := l.max / 2
	written := 0
	for len(p) > 0 {
		if l.size >= half {
			if err := l.rotate(); err != nil {
				return written, err
			}
		}
		n := int64(len(p))
		if room := half - l.size; n > room {
			n = room
		}
		k, err := l.f.Write(p[:n])
		l.size += int64(k)
		written += k
		p = p[k:]
		if err != nil {
			return written, err
		}
	}
	return written, nil
}

func (l *rotLog) rotate() error {
	l.f.Close()
	if err := os.Rename(l.path, l.path+".1"); err != nil && !os.IsNotExist(err) {
		return err
	}
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o640)
	if err != nil {
		return err
	}
	l.f, l.size = f, 0
	return nil
}

// snapshot opens the log as it is now; rotations after this call do not affect the readers.
func (l *rotLog) snapshot() ([]*io.SectionReader, []*os.File) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var readers []*io.SectionReader
	var files []*os.File
	for _, name := range []string{l.path + ".1", l.path} {
		f, err := os.Open(name)
		if err != nil {
			continue
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			continue
		}
		files = append(files, f)
		readers = append(readers, io.NewSectionReader(f, 0, fi.Size()))
	}
	return readers, files
}

// logsState streams a log snapshot as STDOUT frames followed by EXIT(0).
type logsState struct {
	s        *session
	id       uint32
	mu       sync.Mutex
	cond     *sync.Cond
	credit   int64
	killed   bool
	detached bool
}

func (s *session) startLogs(id uint32, payload []byte) {
	if id == 0 || s.streamInUse(id) {
		s.sendError(id, codeInvalidArgument, "LOGS needs a free, non-zero stream id")
		return
	}
	if s.ag.log == nil {
		s.sendError(id, codeUnsupported, "this guest agent keeps no main process log (it was started without --log)")
		return
	}
	var req struct {
		Window int64 `json:"window"`
	}
	if len(payload) > 0 {
		if err := json.Unmarshal(payload, &req); err != nil {
			s.sendError(id, codeInvalidArgument, "LOGS payload is not valid JSON: "+err.Error())
			return
		}
	}
	if req.Window <= 0 {
		req.Window = defaultWindow
	}
	ls := &logsState{s: s, id: id, credit: req.Window}
	ls.cond = sync.NewCond(&ls.mu)
	s.register(id, ls)
	readers, files := s.ag.log.snapshot()
	go ls.run(readers, files)
}

func (ls *logsState) run(readers []*io.SectionReader, files []*os.File) {
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for _, r := range readers {
		for remaining := r.Size(); remaining > 0; {
			ls.mu.Lock()
			for ls.credit <= 0 && !ls.killed {
				ls.cond.Wait()
			}
			n := ls.credit
			killed := ls.killed
			ls.mu.Unlock()
			if killed {
				break
			}
			if n > maxData {
				n = maxData
			}
			bp := getBuf()
			k, err := r.Read((*bp)[:n])
			remaining -= int64(k)
			if k > 0 {
				ls.mu.Lock()
				ls.credit -= int64(k)
				ls.mu.Unlock()
				if !ls.sendAttached(outFrame{typ: tStdout, stream: ls.id, payload: (*bp)[:k], buf: bp}) {
					return
				}
			} else {
				putBuf(bp)
			}
			if err != nil {
				break
			}
		}
	}
	ls.s.unregister(ls.id, ls)
	ls.sendAttached(outFrame{typ: tExit, stream: ls.id, payload: exitPayload(0, "")})
}

func (ls *logsState) sendAttached(f outFrame) bool {
	ls.mu.Lock()
	detached := ls.detached
	ls.mu.Unlock()
	if detached {
		if f.buf != nil {
			putBuf(f.buf)
		}
		return false
	}
	return ls.s.send(f)
}

func (ls *logsState) addCredit(ch byte, inc uint32) {
	if ch != chStdout {
		return
	}
	ls.mu.Lock()
	ls.credit += int64(inc)
	ls.cond.Broadcast()
	ls.mu.Unlock()
}

func (ls *logsState) stdin([]byte) {}
func (ls *logsState) stdinClose()  {}

func (ls *logsState) kill() {
	ls.mu.Lock()
	ls.killed = true
	ls.cond.Broadcast()
	ls.mu.Unlock()
}

func (ls *logsState) abandon() {
	ls.mu.Lock()
	ls.detached = true
	ls.mu.Unlock()
	ls.kill()
}
