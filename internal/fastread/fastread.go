// Package fastread reads the caller's own small kernel files (its cgroup
// control files, /proc/self/status) again and again into a buffer the
// caller keeps, through a descriptor kept open, without allocating once
// warm. Unlike package safefs it checks neither file type nor file system:
// a caller finds the files through safefs first.
package fastread

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// File is a file name read again and again: opened at the first Read and
// kept open (its *os.File closes it if dropped), read again from offset 0,
// which makes a kernel file's content anew. The zero value is no file:
// Read fails on it. Copies share the open file: use one alone. A File is
// not safe for concurrent use.
type File struct {
	name string
	c    []byte   // name and a NUL
	f    *os.File // nil: not open
}

// New returns name prepared for Read, not yet open; a name holding a NUL
// byte is an error.
func New(name string) (File, error) {
	if name == "" || strings.IndexByte(name, 0) >= 0 {
		return File{}, fmt.Errorf("fastread: invalid file name %q", name)
	}
	return File{name: name, c: append([]byte(name), 0)}, nil
}

// String returns the file name.
func (f *File) String() string { return f.name }

// ErrTooLarge is matched by the error of a Read of a file longer than max.
var ErrTooLarge = errors.New("fastread: file larger than the cap")

// Read reads the whole file into buf[:0] and returns it: at most max
// bytes, else an error matching ErrTooLarge. It allocates only to grow buf
// past its capacity, to open the file, and on error. A file that cannot be
// opened returns the kernel's errno (fs.ErrNotExist matches ENOENT),
// without allocating; after any other error the file is closed, and the
// next Read opens it again.
func (f *File) Read(buf []byte, max int) ([]byte, error) {
	if f.f == nil {
		if len(f.c) == 0 {
			return buf[:0], errors.New("fastread: no file")
		}
		fd, err := openat(f.c)
		if err != nil {
			return buf[:0], err
		}
		f.f = os.NewFile(uintptr(fd), f.name)
	}
	buf = buf[:0]
	for len(buf) <= max {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := f.f.ReadAt(buf[len(buf):min(cap(buf), max+1)], int64(len(buf)))
		buf = buf[:len(buf)+n]
		if err == io.EOF && len(buf) <= max {
			return buf, nil
		}
		if err != nil {
			f.Close()
			return buf[:0], err
		}
	}
	f.Close()
	return buf[:0], ErrTooLarge
}

// Close closes the file if it is open; a later Read opens it again.
func (f *File) Close() {
	if f.f != nil {
		_ = f.f.Close()
		f.f = nil
	}
}
