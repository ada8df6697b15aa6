// vsock-probe runs as a test guest's init helper (kernel with vsock_loopback): it listens on the
// ready port, starts the agent with --listen vsock:PORT --ready-vsock 1:READY, waits for "ready\n",
// then opens two connections to CID 1 (VMADDR_CID_LOCAL) and does HELLO + PING on each. It prints
// one line starting with VSOCK-PROBE-OK or VSOCK-PROBE-FAILED on the console.
package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"
	"unsafe"
)

const afVsock = 40

func sockaddr(cid, port uint32) []byte {
	sa := make([]byte, 16)
	binary.LittleEndian.PutUint16(sa[0:], afVsock)
	binary.LittleEndian.PutUint32(sa[4:], port)
	binary.LittleEndian.PutUint32(sa[8:], cid)
	return sa
}

func call(trap uintptr, fd int, sa []byte) error {
	if _, _, e := syscall.Syscall(trap, uintptr(fd), uintptr(unsafe.Pointer(&sa[0])), uintptr(len(sa))); e != 0 {
		return e
	}
	return nil
}

func fail(format string, args ...any) {
	fmt.Printf("VSOCK-PROBE-FAILED: "+format+"\n", args...)
	os.Exit(1)
}

func dial(cid, port uint32) *os.File {
	fd, err := syscall.Socket(afVsock, syscall.SOCK_STREAM, 0)
	if err != nil {
		fail("socket: %v", err)
	}
	if err := call(syscall.SYS_CONNECT, fd, sockaddr(cid, port)); err != nil {
		fail("connect %d:%d: %v", cid, port, err)
	}
	return os.NewFile(uintptr(fd), "vsock")
}

func frame(typ byte, stream uint32, payload []byte) []byte {
	h := make([]byte, 12)
	h[0], h[1], h[2] = 'V', 'Z', typ
	binary.BigEndian.PutUint32(h[4:], stream)
	binary.BigEndian.PutUint32(h[8:], uint32(len(payload)))
	return append(h, payload...)
}

func readFrame(r io.Reader) (byte, []byte) {
	h := make([]byte, 12)
	if _, err := io.ReadFull(r, h); err != nil {
		fail("reading a frame header: %v", err)
	}
	if h[0] != 'V' || h[1] != 'Z' {
		fail("bad magic %q", h[:2])
	}
	p := make([]byte, binary.BigEndian.Uint32(h[8:]))
	if _, err := io.ReadFull(r, p); err != nil {
		fail("reading a payload: %v", err)
	}
	return h[2], p
}

// session: HELLO (skipping READY frames), then PING with a payload; returns the agent's pid.
func session(c *os.File, nonce string) float64 {
	hello, _ := json.Marshal(map[string]any{"versions": []int{1}, "nonce": nonce})
	c.Write(frame(0x01, 0, hello))
	for {
		typ, p := readFrame(c)
		if typ == 0x03 {
			continue
		}
		if typ != 0x02 {
			fail("expected HELLO_REPLY, got type %#x: %q", typ, p)
		}
		var doc map[string]any
		if err := json.Unmarshal(p, &doc); err != nil || doc["nonce"] != nonce {
			fail("HELLO_REPLY %q does not carry nonce %s", p, nonce)
		}
		if doc["mode"] != "unix" {
			fail("HELLO_REPLY mode %v, want one session per connection", doc["mode"])
		}
		pid, _ := doc["pid"].(float64)
		c.Write(frame(0x04, 7, []byte("ping-"+nonce)))
		typ, p = readFrame(c)
		if typ != 0x05 || !bytes.Equal(p, []byte("ping-"+nonce)) {
			fail("expected PONG ping-%s, got type %#x %q", nonce, typ, p)
		}
		return pid
	}
}

func main() {
	agent, port, ready := os.Args[1], uint32(1234), uint32(1235)
	lfd, err := syscall.Socket(afVsock, syscall.SOCK_STREAM, 0)
	if err != nil {
		fail("socket: %v (vsock_loopback not loaded?)", err)
	}
	if err := call(syscall.SYS_BIND, lfd, sockaddr(0xFFFFFFFF, ready)); err != nil {
		fail("bind %d: %v", ready, err)
	}
	syscall.Listen(lfd, 4)
	cmd := exec.Command(agent, "serve", "--listen", "vsock:"+strconv.Itoa(int(port)), "--ready-vsock", "1:"+strconv.Itoa(int(ready)))
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		fail("starting the agent: %v", err)
	}
	got := make(chan string, 1)
	go func() {
		nfd, _, e := syscall.Syscall6(syscall.SYS_ACCEPT4, uintptr(lfd), 0, 0, 0, 0, 0)
		if e != 0 {
			got <- "accept: " + e.Error()
			return
		}
		b, _ := io.ReadAll(os.NewFile(nfd, "ready"))
		got <- string(b)
	}()
	select {
	case msg := <-got:
		if msg != "ready\n" {
			fail("the ready connection carried %q", msg)
		}
	case <-time.After(60 * time.Second):
		fail("no ready connection within 60 s")
	}
	a, b := dial(1, port), dial(1, port)
	pa := session(a, "first")
	pb := session(b, "second")
	if pa != float64(cmd.Process.Pid) || pb != pa {
		fail("HELLO facts pid %v/%v, the agent is %d", pa, pb, cmd.Process.Pid)
	}
	a.Close()
	b.Close()
	cmd.Process.Signal(syscall.SIGTERM)
	state, _ := cmd.Process.Wait()
	fmt.Printf("VSOCK-PROBE-OK ready two-sessions pid=%d exit=%d\n", cmd.Process.Pid, state.ExitCode())
}
