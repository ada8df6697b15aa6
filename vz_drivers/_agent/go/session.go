package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
)

// A stream is one exec or logs transfer multiplexed on a session.
type stream interface {
	addCredit(ch byte, inc uint32)
	stdin(data []byte)
	stdinClose()
	kill()
	abandon() // kill, and send nothing more for this stream
}

type outFrame struct {
	typ     byte
	stream  uint32
	payload []byte
	buf     *[]byte       // pooled buffer behind payload, recycled after the write
	flushed chan struct{} // closed once the frame reached the connection
}

// A session is one host connection: a Unix socket connection, or the single byte stream of a
// device (which gets a new session each time the host starts over).
type session struct {
	ag         *agent
	r          *bufio.Reader
	w          io.Writer
	closeConn  func()
	streamMode bool
	fromHost   bool // a vsock connection whose peer is the host (CID 2)

	out        chan outFrame
	done       chan struct{}
	doneOnce   sync.Once
	writerDone chan struct{}

	mu      sync.Mutex
	streams map[uint32]stream
	hello   bool
	nonce   string
	// maxData is the largest data frame agreed in HELLO ("max_data"; maxData unless the host asked for more).
	// Written by the reading goroutine only, before any stream of the session exists.
	maxData uint32
	fds     *fdReader // descriptors passed by the host (Unix socket connections only), nil elsewhere
}

func newSession(ag *agent, r io.Reader, w io.Writer, closeConn func(), streamMode bool) *session {
	s := &session{
		ag: ag, w: w, closeConn: closeConn, streamMode: streamMode,
		out: make(chan outFrame, 256), done: make(chan struct{}), writerDone: make(chan struct{}),
		streams: map[uint32]stream{}, maxData: maxData,
	}
	if uc, ok := r.(*net.UnixConn); ok {
		s.fds = newFdReader(uc)
		r = s.fds
	}
	s.r = bufio.NewReaderSize(r, 64*1024)
	return s
}

// send queues a frame; false when the session is over (the frame is dropped).
func (s *session) send(f outFrame) bool {
	select {
	case s.out <- f:
		return true
	case <-s.done:
		if f.buf != nil {
			putBuf(f.buf)
		}
		return false
	}
}

func (s *session) sendError(stream uint32, code, msg string) {
	s.send(outFrame{typ: tError, stream: stream, payload: errorPayload(code, msg)})
}

// sendFlushed queues a frame and waits until it was written (or the session ended).
func (s *session) sendFlushed(f outFrame) {
	f.flushed = make(chan struct{})
	if s.send(f) {
		select {
		case <-f.flushed:
		case <-s.done:
		}
	}
}

func (s *session) writer() {
	defer close(s.writerDone)
	bw := bufio.NewWriterSize(s.w, 64*1024)
	var hdr [headerSize]byte
	var flushed []chan struct{}
	var err error
	write := func(f outFrame) {
		if err == nil {
			putHeader(hdr[:], f.typ, f.stream, len(f.payload))
			if _, err = bw.Write(hdr[:]); err == nil && len(f.payload) > 0 {
				_, err = bw.Write(f.payload)
			}
		}
		if f.buf != nil {
			putBuf(f.buf)
		}
		if f.flushed != nil {
			flushed = append(flushed, f.flushed)
		}
	}
	for {
		select {
		case f := <-s.out:
			write(f)
		case <-s.done:
			return
		}
	more:
		for {
			select {
			case f := <-s.out:
				write(f)
			default:
				break more
			}
		}
		if err == nil {
			err = bw.Flush()
		}
		for _, c := range flushed {
			close(c)
		}
		flushed = flushed[:0]
		if err != nil {
			logf("writing to the host failed: %v", err)
			s.end()
			return
		}
	}
}

// run serves the session until the connection ends; it returns after the writer stopped.
func (s *session) run() {
	s.ag.addSession(s)
	go s.writer()
	if s.streamMode {
		s.send(outFrame{typ: tReady, payload: []byte(readyPayload)})
	}
	hbuf := make([]byte, headerSize)
	for {
		h, payload, err := readFrame(s.r, hbuf, s.maxData)
		if err != nil {
			if errors.Is(err, errBadHeader) && s.streamMode {
				logf("lost frame sync (%v); waiting for the host to start over", err)
				s.resetStreams()
				h, payload, err = s.resync(hbuf)
			}
			if err != nil {
				if err != io.EOF && !errors.Is(err, errSessionEnded) {
					logf("reading from the host: %v", err)
				}
				break
			}
		}
		s.dispatch(h, payload)
	}
	s.end()
	if s.closeConn != nil {
		s.closeConn()
	}
	if s.fds != nil {
		s.fds.closeAll()
	}
	<-s.writerDone
	s.ag.removeSession(s)
}

var errSessionEnded = errors.New("session ended")

// resync skips bytes until a HELLO frame header, after a framing error on a single-stream transport.
func (s *session) resync(hbuf []byte) (header, []byte, error) {
	if _, err := io.ReadFull(s.r, hbuf); err != nil {
		return header{}, nil, err
	}
	for {
		if h, err := parseHeader(hbuf, s.maxData); err == nil && h.typ == tHello && h.stream == 0 {
			payload := make([]byte, h.length)
			if _, err := io.ReadFull(s.r, payload); err != nil {
				return h, nil, err
			}
			return h, payload, nil
		}
		copy(hbuf, hbuf[1:])
		c, err := s.r.ReadByte()
		if err != nil {
			return header{}, nil, err
		}
		hbuf[headerSize-1] = c
	}
}

// end finishes the session: every stream is killed and the writer stops.
func (s *session) end() {
	s.doneOnce.Do(func() {
		close(s.done)
		s.resetStreams()
	})
}

func (s *session) resetStreams() {
	s.mu.Lock()
	streams := s.streams
	s.streams = map[uint32]stream{}
	s.mu.Unlock()
	for _, st := range streams {
		st.abandon()
	}
}

func (s *session) get(id uint32) stream {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.streams[id]
}

// register adds a stream under a free id; false when the id is taken.
func (s *session) register(id uint32, st stream) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, taken := s.streams[id]; taken {
		return false
	}
	s.streams[id] = st
	return true
}

func (s *session) unregister(id uint32, st stream) {
	s.mu.Lock()
	if s.streams[id] == st {
		delete(s.streams, id)
	}
	s.mu.Unlock()
}

func (s *session) streamInUse(id uint32) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.streams[id]
	return ok
}

func (s *session) countExecs() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, st := range s.streams {
		switch st.(type) {
		case *execState, *fdExec:
			n++
		}
	}
	return n
}

func (s *session) dispatch(h header, payload []byte) {
	switch h.typ {
	case tHello:
		s.handleHello(payload)
		return
	case tPing:
		s.send(outFrame{typ: tPong, stream: h.stream, payload: payload})
		return
	case tStatus:
		b, _ := json.Marshal(s.ag.status())
		s.send(outFrame{typ: tStatusReply, stream: h.stream, payload: b})
		return
	}
	if !s.hello {
		if h.typ == tExecStart || h.typ == tExecFds || h.typ == tLogs || h.typ == tShutdown ||
			h.typ == tServices || h.typ == tServiceStates || h.typ == tServiceLogs {
			s.sendError(h.stream, codeFailedPrecondition, "the host must send HELLO before any other request")
		}
		return
	}
	switch h.typ {
	case tShutdown:
		var req struct {
			GraceMs int64 `json:"grace_ms"`
		}
		if len(payload) > 0 {
			if err := json.Unmarshal(payload, &req); err != nil {
				s.sendError(h.stream, codeInvalidArgument, "SHUTDOWN payload is not valid JSON: "+err.Error())
				return
			}
		}
		go s.ag.shutdown(s, h.stream, req.GraceMs)
	case tExecStart:
		s.startExec(h.stream, payload)
	case tExecFds:
		s.startExecFds(h.stream, payload)
	case tLogs:
		s.startLogs(h.stream, payload)
	case tServices:
		s.handleServices(h.stream, payload)
	case tServiceStates:
		s.handleServiceStates(h.stream)
	case tServiceLogs:
		s.handleServiceLogs(h.stream, payload)
	case tStdin:
		if st := s.get(h.stream); st != nil && len(payload) > 0 {
			st.stdin(payload)
		}
	case tStdinClose:
		if st := s.get(h.stream); st != nil {
			st.stdinClose()
		}
	case tKill:
		if st := s.get(h.stream); st != nil {
			st.kill()
		}
	case tResize:
		if st, ok := s.get(h.stream).(*execState); ok {
			st.resize(payload)
		}
	case tWindow:
		if len(payload) == 5 {
			if st := s.get(h.stream); st != nil {
				st.addCredit(payload[0], binary.BigEndian.Uint32(payload[1:]))
			}
		}
	default:
		// Unknown frame types are ignored so that newer hosts can probe older agents.
	}
}

type helloRequest struct {
	Versions []int  `json:"versions"`
	Nonce    string `json:"nonce"`
	// MaxData: the largest data frame the host would like to use (optional; absent = maxData).
	MaxData int64 `json:"max_data"`
	// Challenge: a fresh host nonce the agent answers with "proof" (identity.go).
	Challenge string `json:"challenge"`
	// Key: the boot's identity key, taken once with --key-from-host on a device port or a vsock connection
	// from the host's CID (identity.go).
	Key string `json:"key"`
}

func (s *session) handleHello(payload []byte) {
	var req helloRequest
	if err := json.Unmarshal(payload, &req); err != nil {
		s.sendError(0, codeInvalidArgument, "HELLO payload is not valid JSON: "+err.Error())
		return
	}
	ok := false
	for _, v := range req.Versions {
		if v == protocolVersion {
			ok = true
		}
	}
	if !ok {
		s.sendError(0, codeIncompatible, fmt.Sprintf(
			"this guest agent speaks protocol version %d, the host offered %v; use a matching vz-agent",
			protocolVersion, req.Versions))
		return
	}
	s.mu.Lock()
	same := s.hello && req.Nonce == s.nonce
	s.mu.Unlock()
	if s.hello && !same {
		// A host that starts over (a new nonce) abandons everything of the previous one.
		s.resetStreams()
	}
	agreed := uint32(maxData)
	if req.MaxData > maxData {
		agreed = uint32(maxWideData)
		if req.MaxData < maxWideData {
			agreed = uint32(req.MaxData)
		}
	}
	s.mu.Lock()
	s.hello, s.nonce = true, req.Nonce
	s.maxData = agreed
	s.mu.Unlock()
	if agreed > maxData {
		if uc, ok := s.w.(*net.UnixConn); ok {
			uc.SetWriteBuffer(wideSocketBuffer) // best effort: a few wide frames in flight per send
		}
	}
	reply := s.ag.facts()
	reply["max_data"] = agreed
	reply["version"] = protocolVersion
	reply["nonce"] = req.Nonce
	if req.Key != "" && s.ag.o.keyFromHost && (s.streamMode || s.fromHost) {
		s.ag.takeKey(req.Key)
	}
	if req.Challenge != "" {
		if proof := identityProof(s.ag.identityKey(), req.Challenge); proof != "" {
			reply["proof"] = proof
		}
	}
	if s.streamMode {
		reply["mode"] = "stream"
	} else {
		reply["mode"] = "unix"
	}
	b, _ := json.Marshal(reply)
	s.send(outFrame{typ: tHelloReply, payload: b})
}
