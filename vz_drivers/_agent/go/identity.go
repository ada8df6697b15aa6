package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"syscall"
)

// The agent's identity: a per-boot key the host hands over where the Machine cannot read it (an
// inherited descriptor the agent reads at start, or the host-only channel), kept only in the agent's
// memory (the agent is not dumpable: the kernel refuses ptrace, /proc/1/mem and process_vm_* to the
// Machine). A HELLO with a "challenge" is answered with "proof" = HMAC-SHA256(key, identityLabel ||
// challenge): the key never crosses the wire, and anything exec'd in place of the agent lost it.
const (
	identityLabel = "vz-agent identity v1\n"
	maxKeyLine    = 256 // bytes of hex (128 bytes of key)
	minKeyBytes   = 16
)

// readIdentityKey reads one line of hex from fd, byte by byte (nothing after the newline is consumed,
// so the descriptor can go on serving as the readiness channel).
func readIdentityKey(fd int) ([]byte, error) {
	line := make([]byte, 0, 2*32)
	defer func() {
		for i := range line {
			line[i] = 0
		}
	}()
	if err := syscall.SetNonblock(fd, false); err != nil {
		return nil, err
	}
	var b [1]byte
	for {
		n, err := syscall.Read(fd, b[:])
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, errors.New("the descriptor ended before the key's newline")
		}
		if b[0] == '\n' {
			break
		}
		if len(line) >= maxKeyLine {
			return nil, fmt.Errorf("the key is longer than %d hex digits", maxKeyLine)
		}
		line = append(line, b[0])
	}
	key := make([]byte, hex.DecodedLen(len(line)))
	if _, err := hex.Decode(key, line); err != nil {
		return nil, errors.New("the key is not hexadecimal")
	}
	if len(key) < minKeyBytes {
		return nil, fmt.Errorf("the key has %d bytes, at least %d are needed", len(key), minKeyBytes)
	}
	return key, nil
}

// identityProof answers a host's challenge ("" when the agent holds no key).
func identityProof(key []byte, challenge string) string {
	if len(key) == 0 {
		return ""
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(identityLabel))
	mac.Write([]byte(challenge))
	return hex.EncodeToString(mac.Sum(nil))
}

// takeKey keeps the first key a host hands over on the device port (--key-from-host); later ones are
// ignored, so a key can be set once per boot and never replaced.
func (ag *agent) takeKey(hexKey string) {
	key, err := hex.DecodeString(hexKey)
	if err != nil || len(key) < minKeyBytes {
		logf("ignoring a malformed identity key from the host")
		return
	}
	ag.mu.Lock()
	defer ag.mu.Unlock()
	if ag.key == nil {
		ag.key = key
	}
}

func (ag *agent) identityKey() []byte {
	ag.mu.Lock()
	defer ag.mu.Unlock()
	return ag.key
}
