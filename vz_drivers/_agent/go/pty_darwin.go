package main

import (
	"bytes"
	"fmt"
	"unsafe"
)

// macOS's posix_openpt/grantpt/unlockpt/ptsname as ioctls on the master (<sys/ttycom.h>).
const (
	tiocptygrant = 0x20007454
	tiocptyunlk  = 0x20007452
	tiocptygname = 0x40807453 // 128-byte name buffer
)

// ptyName grants and unlocks the terminal side of the master mfd and returns its path.
func ptyName(mfd int) (string, error) {
	if err := ioctl(uintptr(mfd), tiocptygrant, nil); err != nil {
		return "", fmt.Errorf("granting the pseudo-terminal: %w", err)
	}
	if err := ioctl(uintptr(mfd), tiocptyunlk, nil); err != nil {
		return "", fmt.Errorf("unlocking the pseudo-terminal: %w", err)
	}
	buf := make([]byte, 128)
	if err := ioctl(uintptr(mfd), tiocptygname, unsafe.Pointer(&buf[0])); err != nil {
		return "", fmt.Errorf("finding the pseudo-terminal's name: %w", err)
	}
	if i := bytes.IndexByte(buf, 0); i >= 0 {
		buf = buf[:i]
	}
	return string(buf), nil
}
