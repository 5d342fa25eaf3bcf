package state

import (
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// pub is the process's one record descriptor.
var pub struct {
	mu       sync.Mutex
	fd       int // -1 before the first Publish
	dev, ino uint64
	seq      int64
}

func init() { pub.fd = -1 }

// Publish makes r the process's record (see the package doc), filling in
// PID, Seq, Version and Updated. On error the previous record, if any,
// stays. It costs the encoding and a few system calls. Safe for concurrent
// use.
func Publish(r *Record) error {
	pub.mu.Lock()
	defer pub.mu.Unlock()
	pub.seq++
	r.Seq, r.PID = pub.seq, os.Getpid()
	r.Updated = now().UTC()
	b, err := Encode(r)
	if err != nil {
		return err
	}
	fd, err := unix.MemfdCreate(MemfdName, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return fmt.Errorf("state: memfd_create: %w", err)
	}
	for off := 0; off < len(b); {
		n, err := unix.Pwrite(fd, b[off:], int64(off))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			unix.Close(fd)
			return fmt.Errorf("state: write: %w", err)
		}
		off += n
	}
	seals := unix.F_SEAL_WRITE | unix.F_SEAL_GROW | unix.F_SEAL_SHRINK | unix.F_SEAL_SEAL
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		unix.Close(fd)
		return fmt.Errorf("state: seal: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return fmt.Errorf("state: fstat: %w", err)
	}
	if pub.fd >= 0 && ours(pub.fd) {
		// Replace the old record in place, atomically for readers.
		err := unix.Dup3(fd, pub.fd, unix.O_CLOEXEC)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("state: dup3: %w", err)
		}
	} else {
		// First record, or the program closed the descriptor (a loop
		// closing every fd): keep the new one where it is.
		pub.fd = fd
	}
	pub.dev, pub.ino = st.Dev, st.Ino
	return nil
}

// ours reports whether fd still holds our record, not a reused descriptor.
func ours(fd int) bool {
	var st unix.Stat_t
	return unix.Fstat(fd, &st) == nil && st.Dev == pub.dev && st.Ino == pub.ino
}

// Descriptor returns the descriptor that holds the record, -1 before the
// first Publish. For tests.
func Descriptor() int {
	pub.mu.Lock()
	defer pub.mu.Unlock()
	return pub.fd
}
