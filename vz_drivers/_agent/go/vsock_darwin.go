package main

import (
	"encoding/binary"
	"syscall"
)

// vsockSockaddr: macOS's packed struct sockaddr_vm { u8 len; u8 family; u16 reserved1; u32 port;
// u32 cid } (<sys/vsock.h>, 12 bytes, host byte order).
func vsockSockaddr(cid, port uint32) []byte {
	sa := make([]byte, 12)
	sa[0], sa[1] = 12, afVsock
	binary.LittleEndian.PutUint32(sa[4:], port)
	binary.LittleEndian.PutUint32(sa[8:], cid)
	return sa
}

// vsockAccept: macOS has no accept4; close-on-exec is set under the fork lock.
func vsockAccept(fd int) (int, error) {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	nfd, _, errno := syscall.Syscall(syscall.SYS_ACCEPT, uintptr(fd), 0, 0)
	if errno != 0 {
		return -1, errno
	}
	syscall.CloseOnExec(int(nfd))
	return int(nfd), nil
}
