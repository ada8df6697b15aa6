package main

import (
	"fmt"
	"strconv"
	"syscall"
	"unsafe"
)

// ptyName unlocks the terminal side of the master mfd (TIOCSPTLCK) and returns its path (TIOCGPTN).
func ptyName(mfd int) (string, error) {
	unlock := int32(0)
	if err := ioctl(uintptr(mfd), syscall.TIOCSPTLCK, unsafe.Pointer(&unlock)); err != nil {
		return "", fmt.Errorf("unlocking the pseudo-terminal: %w", err)
	}
	var n uint32
	if err := ioctl(uintptr(mfd), syscall.TIOCGPTN, unsafe.Pointer(&n)); err != nil {
		return "", fmt.Errorf("finding the pseudo-terminal's number: %w", err)
	}
	return "/dev/pts/" + strconv.FormatUint(uint64(n), 10), nil
}
