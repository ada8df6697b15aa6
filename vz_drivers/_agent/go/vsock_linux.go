package main

import (
	"encoding/binary"
	"syscall"
)

// vsockSockaddr: Linux's struct sockaddr_vm { u16 family; u16 reserved1; u32 port; u32 cid;
// u8 flags; u8 zero[3] } (16 bytes, host byte order).
func vsockSockaddr(cid, port uint32) []byte {
	sa := make([]byte, 16)
	binary.LittleEndian.PutUint16(sa[0:], afVsock)
	binary.LittleEndian.PutUint32(sa[4:], port)
	binary.LittleEndian.PutUint32(sa[8:], cid)
	return sa
}

// vsockAccept accepts with a raw accept4: syscall.Accept4 closes the new descriptor because it
// cannot decode an AF_VSOCK peer address.
func vsockAccept(fd int) (int, error) {
	nfd, _, errno := syscall.Syscall6(syscall.SYS_ACCEPT4, uintptr(fd), 0, 0, syscall.SOCK_CLOEXEC, 0, 0)
	if errno != 0 {
		return -1, errno
	}
	return int(nfd), nil
}
