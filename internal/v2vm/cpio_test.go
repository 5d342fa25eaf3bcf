package v2vm

import (
	"fmt"
	"io"
	"strings"
)

// cpioWriter writes a cpio archive in the "newc" format the kernel unpacks
// as an initramfs (Documentation/driver-api/early-userspace/buffer-format.rst).
// Not safe for concurrent use.
type cpioWriter struct {
	w   io.Writer
	ino int
	err error
}

// Mode bits of a cpio entry (as in stat(2)).
const (
	cpioDir  = 0o040000
	cpioFile = 0o100000
	cpioChar = 0o020000
)

// entry writes one entry: name without a leading slash, mode with its type
// bits, data for a file, rdev major and minor for a device node.
func (c *cpioWriter) entry(name string, mode int, data []byte, rmaj, rmin int) {
	if c.err != nil {
		return
	}
	name = strings.TrimPrefix(name, "/")
	c.ino++
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, 1, 0, len(data), 0, 0, rmaj, rmin, len(name)+1, 0)
	c.write([]byte(hdr))
	c.write([]byte(name + "\x00"))
	c.pad(len(hdr) + len(name) + 1)
	c.write(data)
	c.pad(len(data))
}

func (c *cpioWriter) write(b []byte) {
	if c.err == nil {
		_, c.err = c.w.Write(b)
	}
}

func (c *cpioWriter) pad(n int) {
	if r := n % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

// close writes the trailer and returns the first error.
func (c *cpioWriter) close() error {
	c.entry("TRAILER!!!", 0, nil, 0, 0)
	return c.err
}
