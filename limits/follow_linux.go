package limits

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// inotifyFollower watches files for IN_MODIFY through an inotify file
// read with the runtime's network poller.
type inotifyFollower struct {
	f    *os.File
	wds  []int
	buf  [4096]byte
	once sync.Once
	// closed is set before the file is closed: a racing wait's error is then the close.
	closed atomic.Bool
	lost   bool // a watch was dropped or events lost; the follower's goroutine only
}

func newFollower() (follower, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify_init1: %w", err)
	}
	return &inotifyFollower{f: os.NewFile(uintptr(fd), "inotify")}, nil
}

func (w *inotifyFollower) watch(files []string) bool {
	rc, err := w.f.SyscallConn()
	if err != nil {
		return false
	}
	all := len(files) > 0
	cerr := rc.Control(func(fd uintptr) {
		for _, wd := range w.wds {
			_, _ = unix.InotifyRmWatch(int(fd), uint32(wd))
		}
		w.wds, w.lost = w.wds[:0], false
		for _, f := range files {
			wd, err := unix.InotifyAddWatch(int(fd), f, unix.IN_MODIFY)
			if err != nil {
				all = false
				continue
			}
			w.wds = append(w.wds, wd)
		}
	})
	return all && cerr == nil
}

func (w *inotifyFollower) wait(deadline time.Time) (bool, error) {
	if err := w.f.SetReadDeadline(deadline); err != nil {
		return false, w.closedOr(err)
	}
	n, err := w.f.Read(w.buf[:])
	if err != nil {
		if os.IsTimeout(err) {
			return false, nil
		}
		return false, w.closedOr(err)
	}
	w.noteLost(w.buf[:n]) // any event counts
	return n > 0, nil
}

// noteLost sets lost when events (struct inotify_event) say that a watch of
// wds is gone or events were dropped.
func (w *inotifyFollower) noteLost(b []byte) {
	for len(b) >= unix.SizeofInotifyEvent {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&b[0]))
		if ev.Mask&unix.IN_Q_OVERFLOW != 0 || ev.Mask&unix.IN_IGNORED != 0 && slices.Contains(w.wds, int(ev.Wd)) {
			w.lost = true
		}
		next := unix.SizeofInotifyEvent + int(ev.Len)
		if next > len(b) {
			return
		}
		b = b[next:]
	}
}

func (w *inotifyFollower) stale() bool { return w.lost }

// closedOr returns errFollowClosed for an error close caused, else err.
func (w *inotifyFollower) closedOr(err error) error {
	if w.closed.Load() || errors.Is(err, os.ErrClosed) {
		return errFollowClosed
	}
	return err
}

func (w *inotifyFollower) close() {
	w.once.Do(func() {
		w.closed.Store(true)
		_ = w.f.Close()
	})
}

func (w *inotifyFollower) kind() string { return "inotify" }

// readSmall reads path into buf without allocating; false when it cannot be
// read or does not fit.
func readSmall(path string, buf []byte) (int, bool) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return 0, false
	}
	defer unix.Close(fd)
	n, err := unix.Read(fd, buf)
	if err != nil || n <= 0 || n == len(buf) {
		return 0, false
	}
	return n, true
}

// gVisor's signs, as its docs give them: the marker file runsc
// --gvisor-marker-file makes (gvisor.dev/gvisor/pkg/gvisordetect), and the
// first line its kernel logs (g3doc/user_guide/quick_start/docker.md).
var (
	gvisorMarker = "/proc/gvisor"
	gvisorLog    = []byte("Starting gVisor...")
	// readKernelLog reads the end of the kernel log (syslog(2)), which a host
	// kernel may refuse (dmesg_restrict); tests replace it.
	readKernelLog = func(buf []byte) (int, error) { return unix.Klogctl(unix.SYSLOG_ACTION_READ_ALL, buf) }
)

// detectSandbox returns "gVisor" when the process runs on gVisor's kernel,
// where the cgroup files may not carry the limit its host enforces, and ""
// when no sign is found. The log is easily imitated: the answer is for the
// Reason, never a security decision.
func detectSandbox() string {
	if _, err := os.Stat(gvisorMarker); err == nil {
		return "gVisor"
	}
	buf := make([]byte, 4096)
	if n, err := readKernelLog(buf); err == nil && n > 0 && bytes.Contains(buf[:min(n, len(buf))], gvisorLog) {
		return "gVisor"
	}
	return ""
}
