package fastread

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// openat opens the NUL-terminated name c read-only, retrying on EINTR.
// unix.Open would copy the name into a new NUL-terminated slice at each
// call. The descriptor is blocking, so that os.NewFile does not register it
// with the runtime's poller (kernfs files can be polled).
func openat(c []byte) (int, error) {
	dirfd := unix.AT_FDCWD
	for {
		fd, _, errno := unix.Syscall6(unix.SYS_OPENAT, uintptr(dirfd), uintptr(unsafe.Pointer(&c[0])),
			uintptr(unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOCTTY), 0, 0, 0)
		switch errno {
		case 0:
			return int(fd), nil
		case unix.EINTR:
			continue
		}
		return -1, errno
	}
}
