// Package fastread reads small kernel files (cgroup control files,
// /proc/self/status) again and again into a buffer the caller keeps,
// without allocating once the buffer is large enough.
//
// The paths are the caller's own: its own cgroup as its own mount namespace
// shows it, its own /proc entries. Unlike package safefs, nothing here
// guards against a hostile process's mount namespace (no check of the file
// type or file system); a caller reads through safefs first, and through
// fastread only the files found that way.
package fastread

import (
	"errors"
	"fmt"
	"strings"
)

// Path is a file name prepared once for Read (NUL-terminated). The zero
// value is no path: Read fails on it.
type Path struct {
	name string
	c    []byte // name and a NUL
}

// NewPath returns name prepared for Read; a name holding a NUL byte is an
// error.
func NewPath(name string) (Path, error) {
	if name == "" || strings.IndexByte(name, 0) >= 0 {
		return Path{}, fmt.Errorf("fastread: invalid file name %q", name)
	}
	return Path{name: name, c: append([]byte(name), 0)}, nil
}

// String returns the file name.
func (p Path) String() string { return p.name }

// ErrTooLarge is matched by the error of a Read of a file longer than max.
var ErrTooLarge = errors.New("fastread: file larger than the cap")

// Read reads the whole file p into buf[:0] and returns it: at most max
// bytes, else an error matching ErrTooLarge. It allocates only to grow buf
// past its capacity. The error wraps the kernel's errno (fs.ErrNotExist
// for ENOENT); it does not name the file, for it is built only on failure
// and callers read again through safefs to report one. Safe for concurrent
// use with distinct buffers.
func Read(p Path, buf []byte, max int) ([]byte, error) {
	if len(p.c) == 0 {
		return buf[:0], errors.New("fastread: no path")
	}
	return read(p, buf[:0], max)
}
