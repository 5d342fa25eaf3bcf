//go:build !linux

package safefs

import (
	"errors"
	"fmt"
	"runtime"
)

var errUnsupported = fmt.Errorf("safefs: openat2 is Linux only, not %s: %w", runtime.GOOS, errors.ErrUnsupported)

// OpenDir returns an error matching errors.ErrUnsupported off Linux.
func OpenDir(path string, mode Mode) (*Dir, error) {
	return nil, &PathError{Op: "open", Path: path, Err: errUnsupported}
}

// Sub returns an error matching errors.ErrUnsupported off Linux.
func (d *Dir) Sub(name string, mode Mode) (*Dir, error) {
	return nil, &PathError{Op: "open", Path: d.join(name), Err: errUnsupported}
}

// Close does nothing off Linux.
func (d *Dir) Close() error { return nil }

func dup(fd int) (int, error) { return -1, errUnsupported }

func closeFD(fd int) {}

func readFile(dirfd int, d *Dir, name string, max int64) ([]byte, error) {
	return nil, &PathError{Op: "read", Path: d.join(name), Err: errUnsupported}
}

func scanLines(dirfd int, d *Dir, name string, max int64, each func([]byte) error) error {
	return &PathError{Op: "read", Path: d.join(name), Err: errUnsupported}
}

func statDir(dirfd int, d *Dir, name string) error {
	return &PathError{Op: "open", Path: d.join(name), Err: errUnsupported}
}

// Readlink returns an error matching errors.ErrUnsupported off Linux.
func (d *Dir) Readlink(name string) (string, error) {
	return "", &PathError{Op: "readlink", Path: d.join(name), Err: errUnsupported}
}

// ReadMemfd returns an error matching errors.ErrUnsupported off Linux.
func (d *Dir) ReadMemfd(name string, max int64) (path string, b []byte, err error) {
	return "", nil, &PathError{Op: "open", Path: d.join("fd"), Err: errUnsupported}
}

func subDirs(dirfd int, d *Dir, name string, max int) ([]string, error) {
	return nil, &PathError{Op: "readdir", Path: d.join(name), Err: errUnsupported}
}
