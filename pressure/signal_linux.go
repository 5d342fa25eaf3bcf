package pressure

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/memctl/memctl/internal/cgroupfs"
)

// signal is an open source. Its methods are for one goroutine at a time.
type signal struct {
	kind    srcKind
	path    string
	fd      int
	others  []int // fds held open for the source (the v1 pressure_level)
	events  int16 // POLLPRI (PSI, memory.events) or POLLIN (eventfd, FIFO, socket)
	socket  bool
	last    cgroupfs.Events // the memory.events counters last read
	psi     *arm            // what each PSI event is checked against, nil for others
	noCheck string          // why a PSI source has no psi
}

// openSignal opens s and arms it; on error nothing stays open.
func openSignal(s source) (*signal, error) {
	w := &signal{kind: s.kind, path: s.path, fd: -1}
	var err error
	switch s.kind {
	case srcPSI:
		err = w.openPSI(s.path, s.write)
	case srcV1Level:
		err = w.openV1(s.path)
	case srcSystemd:
		err = w.openSystemd(s.path, s.write)
		if err != nil && !strings.Contains(err.Error(), "$MEMORY_PRESSURE_") {
			err = fmt.Errorf("pressure: $MEMORY_PRESSURE_WATCH=%q: %w", s.path, err)
		}
	case srcEvents:
		err = w.openEvents(s.path)
	}
	if err != nil {
		w.close()
		return nil, err
	}
	return w, nil
}

// pollFd is the source's fd and the events to poll it for.
func (w *signal) pollFd() unix.PollFd { return unix.PollFd{Fd: int32(w.fd), Events: w.events} }

// gone reports whether revents, from poll(2) on PollFd, say the source is
// gone (an error, a hang-up, or none of the events polled for).
func (w *signal) gone(revents int16) bool {
	if w.kind == srcEvents && revents&unix.POLLPRI != 0 {
		revents &^= unix.POLLERR // kernfs signals a change with POLLERR|POLLPRI
	}
	return revents&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0 || revents&w.events == 0
}

// close closes the source's fds.
func (w *signal) close() {
	for _, fd := range append([]int{w.fd}, w.others...) {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
	}
}

func openErr(op, path string, err error) error {
	return &os.PathError{Op: "pressure: " + op, Path: path, Err: err}
}

// openPSI opens a PSI file and writes the trigger; the kernel then signals
// POLLPRI at most once per window while the stall is over the threshold.
func (w *signal) openPSI(path string, trig []byte) error {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return openErr("open", path, err)
	}
	w.fd, w.events = fd, unix.POLLPRI
	if err := checkPSIFile(fd, path); err != nil {
		return err
	}
	w.armPSI(trig)
	if _, err := unix.Write(fd, trig); err != nil {
		perr := openErr(fmt.Sprintf("write trigger %q to", trig), path, err)
		if t, terr := parseTrigger(trig); errors.Is(err, unix.EINVAL) && terr == nil && t.window%2_000_000 != 0 {
			// Linux 6.5 and later (kernel/sched/psi.c psi_trigger_create).
			return fmt.Errorf("%w (a window that is not a multiple of 2 s needs CAP_SYS_RESOURCE)", perr)
		}
		return perr
	}
	return nil
}

// armPSI reads the state's total stall just before the trigger is written;
// if either cannot be parsed, no event is checked and noCheck says why.
func (w *signal) armPSI(trig []byte) {
	t, err := parseTrigger(trig)
	if err == nil && t.stall == 0 {
		err = errors.New("no stall")
	}
	if err != nil {
		w.noCheck = fmt.Sprintf("trigger not understood: %v", err)
		return
	}
	total, err := w.readPSITotal(t.full)
	if err != nil {
		w.noCheck = err.Error()
		return
	}
	w.psi = &arm{trigger: t, armed: total}
}

// readPSITotal reads the total stall (µs) of the trigger's line in w.fd.
func (w *signal) readPSITotal(full bool) (int64, error) {
	var b [512]byte
	n, err := unix.Pread(w.fd, b[:], 0)
	if err != nil {
		return 0, fmt.Errorf("pressure: read %s: %w", w.path, err)
	}
	total, fullTotal := parsePSITotals(b[:n])
	state := "some"
	if full {
		total, state = fullTotal, "full"
	}
	if total < 0 {
		return 0, fmt.Errorf("pressure: %s: no %s total= in %q", w.path, state, b[:n])
	}
	return total, nil
}

// unexplained reports whether the stall since arming fails to explain the
// PSI event just received, with that stall and the threshold.
func (w *signal) unexplained() (since, threshold time.Duration, ignore bool) {
	if w.psi == nil {
		return 0, 0, false
	}
	total, err := w.readPSITotal(w.psi.full)
	if err != nil {
		return 0, 0, false
	}
	us := time.Microsecond
	return time.Duration(total-w.psi.armed) * us, time.Duration(w.psi.stall) * us, !w.psi.explains(total)
}

// window returns the PSI trigger's window (at most one event per window,
// psi.rst); 0 when no event is checked.
func (w *signal) window() time.Duration {
	if w.psi == nil {
		return 0
	}
	return time.Duration(w.psi.window) * time.Microsecond
}

// checkPSIFile checks that the open fd is a PSI file, as systemd does
// (sd_event_add_memory_pressure(3)): a regular file of procfs named
// /proc/pressure/*, or of a cgroup file system named *.pressure.
func checkPSIFile(fd int, path string) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return openErr("fstat", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("pressure: %s is a %s, not a PSI file", path, fileKind(st.Mode))
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return openErr("fstatfs", path, err)
	}
	clean := filepath.Clean(path)
	switch int64(fs.Type) {
	case unix.PROC_SUPER_MAGIC:
		if filepath.Base(filepath.Dir(clean)) == "pressure" {
			return nil
		}
	case unix.CGROUP2_SUPER_MAGIC, unix.CGROUP_SUPER_MAGIC:
		if strings.HasSuffix(filepath.Base(clean), ".pressure") {
			return nil
		}
	default:
		return fmt.Errorf("pressure: %s is a regular file on a file system of type %#x, not procfs or cgroupfs: not a PSI file", path, fs.Type)
	}
	return fmt.Errorf("pressure: %s is not a PSI file (/proc/pressure/*, a cgroup's *.pressure): no trigger written to it", path)
}

// fileKind names the type of a file mode, for errors.
func fileKind(mode uint32) string {
	kinds := map[uint32]string{unix.S_IFREG: "regular file", unix.S_IFDIR: "directory", unix.S_IFCHR: "character device",
		unix.S_IFBLK: "block device", unix.S_IFIFO: "FIFO", unix.S_IFSOCK: "socket", unix.S_IFLNK: "symbolic link"}
	if k, ok := kinds[mode&unix.S_IFMT]; ok {
		return k
	}
	return fmt.Sprintf("file of mode %#o", mode&unix.S_IFMT)
}

// openV1 registers an eventfd for the cgroup v1 memory.pressure_level of
// dir (Documentation/admin-guide/cgroup-v1/memory.rst, "Memory Pressure").
func (w *signal) openV1(dir string) error {
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("pressure: eventfd: %w", err)
	}
	w.fd, w.events = efd, unix.POLLIN
	level := filepath.Join(dir, "memory.pressure_level")
	pfd, err := unix.Open(level, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return openErr("open", level, err)
	}
	w.others = append(w.others, pfd)
	line := strconv.Itoa(efd) + " " + strconv.Itoa(pfd) + " " + v1Level
	if err := os.WriteFile(filepath.Join(dir, "cgroup.event_control"), []byte(line), 0); err != nil {
		return fmt.Errorf("pressure: register %q: %w", line, err)
	}
	return nil
}

// openSystemd opens $MEMORY_PRESSURE_WATCH as systemd's protocol says: a
// socket is connected and read, a FIFO read (opened read-write: no POLLHUP),
// a PSI file armed with the write.
func (w *signal) openSystemd(path string, write []byte) error {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return openErr("stat", path, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFSOCK:
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("pressure: socket: %w", err)
		}
		w.fd, w.events, w.socket = fd, unix.POLLIN, true
		if err := unix.Connect(fd, &unix.SockaddrUnix{Name: path}); err != nil {
			return openErr("connect", path, err)
		}
		if err := unix.SetNonblock(w.fd, true); err != nil {
			return fmt.Errorf("pressure: %w", err)
		}
	case unix.S_IFIFO:
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return openErr("open", path, err)
		}
		w.fd, w.events = fd, unix.POLLIN
	case unix.S_IFREG:
		if len(write) == 0 {
			return fmt.Errorf("pressure: $MEMORY_PRESSURE_WATCH=%q is a PSI file and $MEMORY_PRESSURE_WRITE is empty: no trigger to arm", path)
		}
		trig, err := systemdTrigger(write)
		if err != nil {
			return err
		}
		return w.openPSI(path, trig)
	default:
		return fmt.Errorf("pressure: $MEMORY_PRESSURE_WATCH=%q is a %s: want a PSI file, a FIFO or an AF_UNIX socket", path, fileKind(st.Mode))
	}
	if len(write) > 0 {
		if _, err := unix.Write(w.fd, write); err != nil {
			return openErr("write", path, err)
		}
		if !w.socket {
			w.drain() // the FIFO is read too: what was just written is no signal
		}
	}
	return nil
}

// openEvents opens a cgroup v2 memory.events file read-only: the kernel
// signals a change of its counters with POLLPRI (kernfs_notify).
func (w *signal) openEvents(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return openErr("open", path, err)
	}
	w.fd, w.events = fd, unix.POLLPRI
	w.last, err = w.preadEvents()
	return err
}

// preadEvents reads w.fd from its start, clearing kernfs's change flag.
func (w *signal) preadEvents() (cgroupfs.Events, error) {
	var b [1024]byte
	n, err := unix.Pread(w.fd, b[:], 0)
	if err != nil {
		return cgroupfs.Events{}, fmt.Errorf("pressure: read %s: %w", w.path, err)
	}
	return cgroupfs.ParseEvents(b[:n], w.path)
}

// drain consumes what the source has to read and returns how many signals
// it held, or -1 when the source is gone (EOF on a socket).
func (w *signal) drain() int64 {
	switch {
	case w.kind == srcV1Level:
		var b [8]byte
		if n, err := unix.Read(w.fd, b[:]); err != nil || n != 8 {
			return 0
		}
		return int64(min(binary.NativeEndian.Uint64(b[:]), 1<<62))
	case w.kind == srcEvents: // eventsGrowth since the last read
		e, err := w.preadEvents()
		if err != nil {
			return 0
		}
		d := eventsGrowth(w.last, e)
		w.last = e
		return d
	case w.events == unix.POLLIN:
		var b [512]byte
		got := int64(0)
		for {
			n, err := unix.Read(w.fd, b[:])
			if n > 0 {
				got = 1
				continue
			}
			if err == nil && w.socket { // EOF: the service manager closed it
				return -1
			}
			return got
		}
	}
	return 1
}

// v1Level is the cgroup v1 pressure level listened for: at a cgroup's
// limit only "low" fires (kernel 6.18).
const v1Level = "low"

// ownsHostAnon reports whether this process holds at least half of the
// host's anonymous memory.
func (m makeup) ownsHostAnon() bool { return m.Own >= 0 && m.Anon >= 0 && m.Own >= m.Anon-m.Own }

// cgroupMakeup reads the makeup of the cgroup directory dir.
func cgroupMakeup(dir string) (makeup, error) {
	file := dir + "/memory.stat"
	s, err := cgroupfs.ReadMemoryStat(dir)
	if err != nil {
		return unknownMakeup(file), err
	}
	return makeupOfStat(s, file), nil
}
