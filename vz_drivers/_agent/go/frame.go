package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
)

// Wire format: see docs/agent-protocol.md. Every frame is a 12-byte header
// (magic "VZ", type, flags, stream id, payload length; big endian) and a payload.
const (
	headerSize       = 12
	protocolVersion  = 1
	maxData          = 32768
	maxWideData      = 1 << 20 // largest data frame a host may agree on in HELLO ("max_data")
	maxStdinWindow   = 16 << 20
	wideSocketBuffer = 2 << 20 // socket send buffer asked for once wide frames are agreed
	maxControl       = 1 << 20
	defaultWindow    = 256 * 1024
	readyPayload     = "vz-agent"
)

const (
	tHello       = 0x01
	tHelloReply  = 0x02
	tReady       = 0x03
	tPing        = 0x04
	tPong        = 0x05
	tStatus      = 0x06
	tStatusReply = 0x07
	tShutdown    = 0x08
	tShutdownAck = 0x09
	tExecStart   = 0x10
	tExecStarted = 0x11
	tStdin       = 0x12
	tStdinClose  = 0x13
	tStdout      = 0x14
	tStderr      = 0x15
	tExit        = 0x16
	tKill        = 0x17
	tWindow      = 0x18
	tLogs        = 0x19
	tResize      = 0x1A
	tExecFds     = 0x1B
	tError       = 0x1F
	// Services (services.go): request/reply pairs on a request id.
	tServices           = 0x20
	tServicesReply      = 0x21
	tServiceStates      = 0x22
	tServiceStatesReply = 0x23
	tServiceLogs        = 0x24
	tServiceLogsReply   = 0x25
	chStdin             = 0
	chStdout            = 1
	chStderr            = 2
	magic0, magic1      = 'V', 'Z'
)

// Error codes carried by ERROR frames; the names of the Runtime Protocol's RuntimeErrorCode.
const (
	codeInvalidArgument    = "INVALID_ARGUMENT"
	codeUnsupported        = "UNSUPPORTED"
	codeFailedPrecondition = "FAILED_PRECONDITION"
	codePermissionDenied   = "PERMISSION_DENIED"
	codeRuntimeFailure     = "RUNTIME_FAILURE"
	codeIncompatible       = "INCOMPATIBLE_VERSION"
)

var errBadHeader = errors.New("bad frame header")

type header struct {
	typ    byte
	flags  byte
	stream uint32
	length uint32
}

// parseHeader checks a header; dataLimit is the largest data frame the session agreed on.
func parseHeader(b []byte, dataLimit uint32) (header, error) {
	h := header{typ: b[2], flags: b[3], stream: binary.BigEndian.Uint32(b[4:8]), length: binary.BigEndian.Uint32(b[8:12])}
	limit := uint32(maxControl)
	if dataLimit > limit {
		limit = dataLimit
	}
	if b[0] != magic0 || b[1] != magic1 || h.flags != 0 || h.length > limit {
		return h, fmt.Errorf("%w: % x", errBadHeader, b[:headerSize])
	}
	if isData(h.typ) && h.length > dataLimit {
		return h, fmt.Errorf("%w: data frame of %d bytes", errBadHeader, h.length)
	}
	return h, nil
}

func isData(t byte) bool { return t == tStdin || t == tStdout || t == tStderr }

func putHeader(b []byte, typ byte, stream uint32, n int) {
	b[0], b[1], b[2], b[3] = magic0, magic1, typ, 0
	binary.BigEndian.PutUint32(b[4:8], stream)
	binary.BigEndian.PutUint32(b[8:12], uint32(n))
}

// readFrame reads one frame; the payload is freshly allocated, except that of a wide STDIN frame, which
// comes from widePool (the exec's stdin loop puts it back once written: see releaseStdin).
func readFrame(r io.Reader, hbuf []byte, dataLimit uint32) (header, []byte, error) {
	if _, err := io.ReadFull(r, hbuf[:headerSize]); err != nil {
		return header{}, nil, err
	}
	h, err := parseHeader(hbuf, dataLimit)
	if err != nil {
		return h, nil, err
	}
	if h.length == 0 {
		return h, nil, nil
	}
	var payload []byte
	if h.typ == tStdin && h.length > maxData && h.length <= maxWideData {
		payload = (*widePool.Get().(*[]byte))[:h.length]
	} else {
		payload = make([]byte, h.length)
	}
	if _, err := io.ReadFull(r, payload); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return h, nil, err
	}
	return h, payload, nil
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, maxData); return &b }}

var widePool = sync.Pool{New: func() any { b := make([]byte, maxWideData); return &b }}

func getBuf() *[]byte { return bufPool.Get().(*[]byte) }

// getBufSize returns a pooled buffer of at least n bytes (n <= maxWideData).
func getBufSize(n int) *[]byte {
	if n <= maxData {
		return getBuf()
	}
	return widePool.Get().(*[]byte)
}

// releaseStdin returns a wide STDIN payload to widePool once nothing refers to it any more.
func releaseStdin(chunk []byte) {
	if len(chunk) > maxData && cap(chunk) == maxWideData {
		b := chunk[:maxWideData]
		widePool.Put(&b)
	}
}

func putBuf(b *[]byte) {
	if cap(*b) >= maxWideData {
		*b = (*b)[:cap(*b)]
		widePool.Put(b)
		return
	}
	bufPool.Put(b)
}

func windowPayload(ch byte, inc uint32) []byte {
	b := make([]byte, 5)
	b[0] = ch
	binary.BigEndian.PutUint32(b[1:], inc)
	return b
}

func exitPayload(code int, sig string) []byte {
	b := make([]byte, 4+len(sig))
	binary.BigEndian.PutUint32(b, uint32(int32(code)))
	copy(b[4:], sig)
	return b
}

func errorPayload(code, msg string) []byte {
	b, _ := json.Marshal(map[string]string{"code": code, "message": msg})
	return b
}

func u32Payload(v uint32) []byte {
	b := make([]byte, 4)
	binary.BigEndian.PutUint32(b, v)
	return b
}
