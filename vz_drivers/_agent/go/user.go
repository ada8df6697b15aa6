package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"
	"syscall"
)

// inRoot maps a path of the exec's filesystem (chrooted at root) to a path of the agent's
// filesystem, resolving symlinks inside root so that absolute links never escape it.
func inRoot(root, p string) (string, error) {
	if !path.IsAbs(p) {
		return "", fmt.Errorf("%q is not an absolute path", p)
	}
	if root == "" || root == "/" {
		return p, nil
	}
	rest := strings.Split(path.Clean(p), "/")
	cur := "/"
	links := 0
	for len(rest) > 0 {
		c := rest[0]
		rest = rest[1:]
		if c == "" || c == "." {
			continue
		}
		if c == ".." {
			cur = path.Dir(cur)
			continue
		}
		next := path.Join(cur, c)
		fi, err := os.Lstat(root + next)
		if err != nil {
			// Let the caller's stat report the missing component.
			return root + path.Join(append([]string{next}, rest...)...), nil
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			links++
			if links > 40 {
				return "", syscall.ELOOP
			}
			target, err := os.Readlink(root + next)
			if err != nil {
				return "", err
			}
			if path.IsAbs(target) {
				cur = "/"
			}
			rest = append(strings.Split(target, "/"), rest...)
			continue
		}
		cur = next
	}
	return root + cur, nil
}

func statInRoot(root, p string) (os.FileInfo, error) {
	hp, err := inRoot(root, p)
	if err != nil {
		return nil, err
	}
	return os.Stat(hp)
}

var errNotFound = errors.New("executable file not found in $PATH")

// lookPath finds argv[0] like execvp would inside root, returning the path to exec after chroot+chdir.
func lookPath(root, file, pathEnv, workdir string) (string, error) {
	check := func(p string) error {
		abs := p
		if !path.IsAbs(abs) {
			abs = path.Join(workdir, abs)
		}
		fi, err := statInRoot(root, abs)
		if err != nil {
			return err
		}
		if fi.IsDir() {
			return syscall.EACCES
		}
		if fi.Mode()&0o111 == 0 {
			return syscall.EACCES
		}
		return nil
	}
	if strings.Contains(file, "/") {
		if err := check(file); err != nil {
			return "", err
		}
		return file, nil
	}
	var firstErr error
	for _, dir := range strings.Split(pathEnv, ":") {
		if dir == "" {
			dir = "."
		}
		cand := path.Join(dir, file)
		if !path.IsAbs(dir) {
			cand = "./" + cand
		}
		err := check(cand)
		if err == nil {
			return cand, nil
		}
		if firstErr == nil && errors.Is(err, syscall.EACCES) {
			firstErr = err
		}
	}
	if firstErr != nil {
		return "", firstErr
	}
	return "", errNotFound
}

type identity struct {
	uid, gid uint32
	groups   []uint32
	name     string // "" when the uid has no passwd entry
	home     string
}

type passwdEntry struct {
	name     string
	uid, gid uint32
	home     string
}

func readPasswd(root string) []passwdEntry {
	var out []passwdEntry
	forEachLine(root, "/etc/passwd", func(f []string) {
		if len(f) < 6 {
			return
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			return
		}
		out = append(out, passwdEntry{name: f[0], uid: uint32(uid), gid: uint32(gid), home: f[5]})
	})
	return out
}

type groupEntry struct {
	name    string
	gid     uint32
	members []string
}

func readGroup(root string) []groupEntry {
	var out []groupEntry
	forEachLine(root, "/etc/group", func(f []string) {
		if len(f) < 3 {
			return
		}
		gid, err := strconv.ParseUint(f[2], 10, 32)
		if err != nil {
			return
		}
		g := groupEntry{name: f[0], gid: uint32(gid)}
		if len(f) > 3 && f[3] != "" {
			g.members = strings.Split(f[3], ",")
		}
		out = append(out, g)
	})
	return out
}

func forEachLine(root, file string, fn func([]string)) {
	hp, err := inRoot(root, file)
	if err != nil {
		return
	}
	f, err := os.Open(hp)
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		fn(strings.Split(line, ":"))
	}
}

type userError struct{ msg string }

func (e *userError) Error() string { return e.msg }

// resolveUser resolves "", "name", "uid", "name:group", "uid:gid" (any mix) against root's
// /etc/passwd and /etc/group. "" is the agent's own identity.
func resolveUser(root, spec string) (identity, error) {
	passwd := readPasswd(root)
	var id identity
	userPart, groupPart, hasGroup := strings.Cut(spec, ":")
	if spec == "" {
		userPart = strconv.Itoa(os.Geteuid())
	}
	if userPart == "" {
		return id, &userError{fmt.Sprintf("user %q has an empty user name", spec)}
	}
	var entry *passwdEntry
	if n, err := strconv.ParseUint(userPart, 10, 32); err == nil {
		id.uid = uint32(n)
		for i := range passwd {
			if passwd[i].uid == id.uid {
				entry = &passwd[i]
				break
			}
		}
		if entry == nil {
			if spec == "" {
				id.gid = uint32(os.Getegid())
			}
			id.home = "/"
		}
	} else {
		for i := range passwd {
			if passwd[i].name == userPart {
				entry = &passwd[i]
				break
			}
		}
		if entry == nil {
			return id, &userError{fmt.Sprintf("user %q not found in /etc/passwd of the Machine; use an existing user name or a numeric uid", userPart)}
		}
		id.uid = entry.uid
	}
	if entry != nil {
		id.name, id.gid, id.home = entry.name, entry.gid, entry.home
	}
	groups := readGroup(root)
	if hasGroup {
		if groupPart == "" {
			return id, &userError{fmt.Sprintf("user %q has an empty group", spec)}
		}
		if n, err := strconv.ParseUint(groupPart, 10, 32); err == nil {
			id.gid = uint32(n)
		} else {
			found := false
			for _, g := range groups {
				if g.name == groupPart {
					id.gid, found = g.gid, true
					break
				}
			}
			if !found {
				return id, &userError{fmt.Sprintf("group %q not found in /etc/group of the Machine; use an existing group name or a numeric gid", groupPart)}
			}
		}
	}
	id.groups = []uint32{id.gid}
	if id.name != "" && !hasGroup {
		for _, g := range groups {
			for _, m := range g.members {
				if m == id.name && g.gid != id.gid {
					id.groups = append(id.groups, g.gid)
					break
				}
			}
		}
	}
	if id.home == "" {
		id.home = "/"
	}
	return id, nil
}

// credential is nil when no identity change is needed (the agent runs as that user already and
// may not be allowed to call setgroups).
func (id identity) credential() *syscall.Credential {
	if os.Geteuid() != 0 && id.uid == uint32(os.Geteuid()) && id.gid == uint32(os.Getegid()) {
		return nil
	}
	return &syscall.Credential{Uid: id.uid, Gid: id.gid, Groups: id.groups}
}
