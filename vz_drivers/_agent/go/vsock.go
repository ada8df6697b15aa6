package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

// AF_VSOCK: the same number on Linux and macOS. Go's net package does not know the family, so the
// agent opens, binds, accepts and connects with raw system calls and hands the descriptors to the
// runtime poller through os.NewFile (non-blocking).
const (
	afVsock      = 40
	vmaddrCidAny = 0xFFFFFFFF
)

// parseVsockPort reads the PORT of "--listen vsock:PORT".
func parseVsockPort(s string) (uint32, error) {
	p, err := strconv.ParseUint(s, 10, 32)
	if err != nil || p == 0 || p == vmaddrCidAny {
		return 0, fmt.Errorf("vsock:%s: the port must be a number in 1..4294967294", s)
	}
	return uint32(p), nil
}

// parseVsockAddr reads the CID:PORT of "--ready-vsock CID:PORT".
func parseVsockAddr(s string) (cid, port uint32, err error) {
	c, p, ok := strings.Cut(s, ":")
	if !ok {
		return 0, 0, fmt.Errorf("%q: want CID:PORT", s)
	}
	cv, err := strconv.ParseUint(c, 10, 32)
	if err != nil {
		return 0, 0, fmt.Errorf("%q: the CID must be a number", s)
	}
	port, err = parseVsockPort(p)
	if err != nil {
		return 0, 0, err
	}
	return uint32(cv), port, nil
}

func vsockSocket() (int, error) {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	fd, err := syscall.Socket(afVsock, syscall.SOCK_STREAM, 0)
	if err != nil {
		return -1, err
	}
	syscall.CloseOnExec(fd)
	return fd, nil
}

func sockaddrCall(trap uintptr, fd int, sa []byte) error {
	_, _, errno := syscall.Syscall(trap, uintptr(fd), uintptr(unsafe.Pointer(&sa[0])), uintptr(len(sa)))
	if errno != 0 {
		return errno
	}
	return nil
}

// vsockListener is a net.Listener on an AF_VSOCK stream socket: every accepted connection is one
// session, as with --listen unix:.
type vsockListener struct {
	f    *os.File
	port uint32
}

func listenVsock(port uint32) (*vsockListener, error) {
	fd, err := vsockSocket()
	if err != nil {
		return nil, fmt.Errorf("--listen vsock:%d: socket: %v (no vsock transport in this machine?)", port, err)
	}
	if err := sockaddrCall(syscall.SYS_BIND, fd, vsockSockaddr(vmaddrCidAny, port)); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("--listen vsock:%d: bind: %v", port, err)
	}
	if err := syscall.Listen(fd, 16); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("--listen vsock:%d: listen: %v", port, err)
	}
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	return &vsockListener{f: os.NewFile(uintptr(fd), "vsock-listener"), port: port}, nil
}

func (l *vsockListener) Accept() (net.Conn, error) {
	rc, err := l.f.SyscallConn()
	if err != nil {
		return nil, net.ErrClosed
	}
	nfd := -1
	var aerr error
	err = rc.Read(func(fd uintptr) bool {
		nfd, aerr = vsockAccept(int(fd))
		return !errors.Is(aerr, syscall.EAGAIN)
	})
	if err != nil {
		if errors.Is(err, os.ErrClosed) {
			return nil, net.ErrClosed
		}
		return nil, err
	}
	if aerr != nil {
		return nil, aerr
	}
	if err := syscall.SetNonblock(nfd, true); err != nil {
		syscall.Close(nfd)
		return nil, err
	}
	return &fileConn{File: os.NewFile(uintptr(nfd), "vsock"), addr: vsockAddr{port: l.port}, peerCID: vsockPeerCID(nfd)}, nil
}

// vmaddrCidHost is the host's CID: a guest process cannot connect from it (its own connections come from
// the guest's CID or the local CID 1), so only the host can hand over the identity key on a vsock connection.
const vmaddrCidHost = 2

// vsockPeerCID is the CID of the connection's peer (getpeername; the cid field is at offset 8 of sockaddr_vm
// on Linux and macOS alike), or vmaddrCidAny when it cannot be read.
func vsockPeerCID(fd int) uint32 {
	sa := make([]byte, 16)
	n := uint32(len(sa))
	_, _, errno := syscall.Syscall(syscall.SYS_GETPEERNAME, uintptr(fd), uintptr(unsafe.Pointer(&sa[0])), uintptr(unsafe.Pointer(&n)))
	if errno != 0 || n < 12 {
		return vmaddrCidAny
	}
	return binary.LittleEndian.Uint32(sa[8:12])
}

func (l *vsockListener) Close() error   { return l.f.Close() }
func (l *vsockListener) Addr() net.Addr { return vsockAddr{port: l.port} }

type vsockAddr struct{ cid, port uint32 }

func (a vsockAddr) Network() string { return "vsock" }
func (a vsockAddr) String() string  { return fmt.Sprintf("%d:%d", a.cid, a.port) }

// fileConn: an accepted vsock connection as a net.Conn.
type fileConn struct {
	*os.File
	addr    vsockAddr
	peerCID uint32 // who connected (vsockPeerCID)
}

func (c *fileConn) LocalAddr() net.Addr  { return c.addr }
func (c *fileConn) RemoteAddr() net.Addr { return vsockAddr{} }

// readyVsock connects to CID:PORT and writes "ready\n" (--ready-vsock). A failure is logged only:
// the host then times out on its side with the console's tail.
func readyVsock(cid, port uint32) {
	fd, err := vsockSocket()
	if err != nil {
		logf("--ready-vsock %d:%d: socket: %v", cid, port, err)
		return
	}
	f := os.NewFile(uintptr(fd), "vsock-ready")
	defer f.Close()
	done := make(chan error, 1)
	go func() { done <- sockaddrCall(syscall.SYS_CONNECT, fd, vsockSockaddr(cid, port)) }()
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		err = errors.New("timed out")
	}
	if err != nil {
		logf("--ready-vsock %d:%d: connect: %v", cid, port, err)
		return
	}
	if _, err := f.Write([]byte("ready\n")); err != nil {
		logf("--ready-vsock %d:%d: write: %v", cid, port, err)
	}
}
