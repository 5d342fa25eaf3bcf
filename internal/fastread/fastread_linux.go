package fastread

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

func read(p Path, buf []byte, max int) ([]byte, error) {
	fd, err := openat(p)
	if err != nil {
		return buf, err
	}
	defer unix.Close(fd)
	for len(buf) <= max {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := unix.Read(fd, buf[len(buf):min(cap(buf), max+1)])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return buf[:0], err
		}
		if n == 0 {
			return buf, nil
		}
		buf = buf[:len(buf)+n]
	}
	return buf[:0], ErrTooLarge
}

// openat opens p read-only, retrying on EINTR. unix.Open would copy the
// name into a new NUL-terminated slice at each call.
func openat(p Path) (int, error) {
	dirfd := unix.AT_FDCWD
	for {
		fd, _, errno := unix.Syscall6(unix.SYS_OPENAT, uintptr(dirfd), uintptr(unsafe.Pointer(&p.c[0])),
			uintptr(unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOCTTY|unix.O_NONBLOCK), 0, 0, 0)
		switch errno {
		case 0:
			return int(fd), nil
		case unix.EINTR:
			continue
		}
		return -1, errno
	}
}
