package pressure

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/memctl/memctl/internal/cgroupfs"
)

// procPressure is the system-wide memory PSI file (Linux 4.20 and later,
// CONFIG_PSI).
const procPressure = "/proc/pressure/memory"

// v1Level is the cgroup v1 pressure level listened for. At a cgroup's limit
// on this project's test machine (kernel 6.18) only "low" fires, about
// 12,000 times in 15 s, never "medium" or "critical", so waiting for those
// would be waiting for the OOM killer.
const v1Level = "low"

// watcher is the kernel watcher: one goroutine blocked in poll(2) on the
// source's fd and on wake, an eventfd that close writes to.
type watcher struct {
	m    *Monitor
	name string
	// note says why the process's own cgroup is not watched, when the
	// source is host-wide ("" otherwise).
	note string
	// hostWide is set for the system-wide PSI: the host's pressure.
	hostWide bool
	// makeup reads what the memory under pressure is made of.
	makeup func() (Makeup, error)
	// makeupBad is set while the makeup cannot be read (readMakeup).
	makeupBad bool
	// last are the memory.events counters last read (srcEvents).
	last   cgroupfs.Events
	fd     int
	others []int // fds held open for the source (the v1 pressure_level)
	events int16 // POLLPRI (PSI) or POLLIN (eventfd, FIFO, socket)
	kind   sourceKind
	socket bool
	wake   int
	done   chan struct{}
}

// startWatcher opens the first source cfg.Watch allows that works and
// starts its goroutine. On failure it returns nil and an error naming each
// source tried.
func startWatcher(m *Monitor, getenv func(string) string) (*watcher, error) {
	var cands []source
	var why []error
	w := m.cfg.Watch
	if w == WatchAuto || w == WatchSystemd {
		s, ok, off, err := systemdSource(getenv)
		switch {
		case off:
			m.log.Debug("memctl: memory pressure watching turned off by the service manager ($MEMORY_PRESSURE_WATCH=/dev/null)")
			return nil, nil
		case err != nil:
			why = append(why, err)
		case ok:
			cands = append(cands, s)
		case w == WatchSystemd:
			why = append(why, errors.New("pressure: $MEMORY_PRESSURE_WATCH is not set"))
		}
	}
	systemdFailed := len(why) > 0 // $MEMORY_PRESSURE_* set but unusable
	own := ""                     // the process's memory cgroup directory, "" when none
	nsRoot := false               // the process's cgroup is "/": its cgroup namespace root
	var psiWhy error              // why the cgroup's own PSI trigger was refused
	var ownWhy []error
	if w == WatchAuto || w == WatchCgroup {
		l, err := cgroupfs.Of(0)
		switch {
		case err != nil:
			ownWhy = append(ownWhy, ownError{errNoController, err})
			why = append(why, err)
		case l.Version == 2:
			own, nsRoot = l.Dir, l.Cgroup == "/"
			p := filepath.Join(l.Dir, "memory.pressure")
			cands = append(cands, source{kind: srcPSI, path: p, write: psiTrigger(m.cfg.Stall, m.cfg.StallWindow), dir: l.Dir,
				name: fmt.Sprintf("cgroup v2 PSI %s (some %v in %v)", p, m.cfg.Stall, m.cfg.StallWindow)})
			if l.Bytes != cgroupfs.NoLimit {
				// Read-only: usable where memory.pressure cannot be opened
				// for writing (a read-only cgroup mount).
				e := filepath.Join(l.Dir, "memory.events")
				cands = append(cands, source{kind: srcEvents, path: e, dir: l.Dir,
					name: fmt.Sprintf("cgroup v2 %s (high, max, oom)", e)})
			}
		case l.Bytes == cgroupfs.NoLimit && w == WatchAuto:
			// No limit: "low" then fires on any reclaim of the host's page
			// cache, which a busy host does all the time; PSI measures stalls.
			own = l.Dir
			e := ownError{errNoLimit, fmt.Errorf("pressure: cgroup v1 %s has no memory limit: watching PSI instead", l.Dir)}
			ownWhy, why = append(ownWhy, e), append(why, e)
		default:
			own = l.Dir
			cands = append(cands, source{kind: srcV1Level, path: l.Dir, dir: l.Dir,
				name: fmt.Sprintf("cgroup v1 %s/memory.pressure_level %s", l.Dir, v1Level)})
		}
	}
	if w == WatchAuto || w == WatchSystem {
		cands = append(cands, source{kind: srcPSI, path: procPressure, write: psiTrigger(m.cfg.Stall, m.cfg.StallWindow), hostWide: true,
			name: fmt.Sprintf("host-wide PSI %s (some %v in %v)", procPressure, m.cfg.Stall, m.cfg.StallWindow)})
	}
	for _, s := range cands {
		wt, err := openSource(s)
		if err != nil {
			why = append(why, err)
			if s.kind != srcSystemd {
				ownWhy = append(ownWhy, err)
			}
			systemdFailed = systemdFailed || s.kind == srcSystemd
			if s.kind == srcPSI && !s.hostWide {
				psiWhy = err
			}
			continue
		}
		wt.m = m
		wt.hostWide = s.hostWide
		wt.makeup = makeupFunc(m, s, own)
		if s.hostWide {
			wt.note = hostWideNote(w, ownWhy)
			if errors.Is(psiWhy, unix.EPERM) && nsRoot {
				// A container whose limit is out of sight (above its
				// namespace root): say why in the same words.
				wt.note = psiRefusedNote(psiWhy, nsRoot) + "; no limit in sight to watch memory.events for"
			}
		} else if s.kind == srcEvents && psiWhy != nil {
			wt.note = psiRefusedNote(psiWhy, nsRoot)
		}
		wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
		if err != nil {
			wt.closeFDs()
			return nil, fmt.Errorf("pressure: eventfd: %w", err)
		}
		wt.wake, wt.done = wake, make(chan struct{})
		if len(why) > 0 {
			// An earlier source did not work; say why once, then go on: a
			// WARN when the service manager named one (its intent was not
			// followed), DEBUG otherwise (the choice is in the startup line).
			level := slog.LevelDebug
			if systemdFailed {
				level = slog.LevelWarn
			}
			m.log.Log(bg, level, "memctl: memory pressure source skipped", "using", wt.name, "error", errors.Join(why...))
		}
		go wt.run()
		return wt, nil
	}
	if len(why) == 0 {
		return nil, ErrNoSource
	}
	return nil, fmt.Errorf("%w: %w", ErrNoSource, errors.Join(why...))
}

// openSource opens s and arms it; on error nothing stays open.
func openSource(s source) (*watcher, error) {
	w := &watcher{name: s.name, kind: s.kind, fd: -1, wake: -1}
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
		w.closeFDs()
		return nil, err
	}
	return w, nil
}

// openPSI opens a PSI file and writes the trigger; the kernel then signals
// POLLPRI at most once per window while the stall is over the threshold
// (Documentation/accounting/psi.rst). Without PSI (CONFIG_PSI off or
// psi=0) the file is missing or the write fails with EOPNOTSUPP.
func (w *watcher) openPSI(path string, trigger []byte) error {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "pressure: open", Path: path, Err: err}
	}
	w.fd, w.events = fd, unix.POLLPRI
	if err := checkPSIFile(fd, path); err != nil {
		return err
	}
	if _, err := unix.Write(fd, trigger); err != nil {
		perr := &os.PathError{Op: fmt.Sprintf("pressure: write trigger %q to", trigger), Path: path, Err: err}
		var kind string
		var stall, window int64
		if n, _ := fmt.Sscanf(string(trigger), "%s %d %d", &kind, &stall, &window); errors.Is(err, unix.EINVAL) && n == 3 && window%2_000_000 != 0 {
			// Linux 6.5 and later (kernel/sched/psi.c psi_trigger_create).
			return fmt.Errorf("%w (a window that is not a multiple of 2 s needs CAP_SYS_RESOURCE)", perr)
		}
		return perr
	}
	return nil
}

// checkPSIFile checks that the open fd is a PSI file: a regular file of
// procfs (/proc/pressure/*) or of a cgroup file system (memory.pressure),
// as systemd checks $MEMORY_PRESSURE_WATCH (sd_event_add_memory_pressure(3):
// ENOTTY for "a regular file outside of the procfs or cgroupfs file
// systems"). Any other file would take the trigger as data (a regular file
// on disk would be written to) and never signal POLLPRI: armed, silently,
// for nothing; so would another file of those file systems, some of which
// act on any write (memory.force_empty). Hence also the name: a file of
// /proc/pressure, or a cgroup file named *.pressure.
func checkPSIFile(fd int, path string) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &os.PathError{Op: "pressure: fstat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("pressure: %s is a %s, not a PSI file", path, fileKind(st.Mode))
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return &os.PathError{Op: "pressure: fstatfs", Path: path, Err: err}
	}
	clean := filepath.Clean(path)
	switch int64(fs.Type) {
	case unix.PROC_SUPER_MAGIC:
		if filepath.Base(filepath.Dir(clean)) == "pressure" { // /proc/pressure/memory
			return nil
		}
	case unix.CGROUP2_SUPER_MAGIC, unix.CGROUP_SUPER_MAGIC:
		if strings.HasSuffix(filepath.Base(clean), ".pressure") { // memory.pressure
			return nil
		}
	default:
		return fmt.Errorf("pressure: %s is a regular file on a file system of type %#x, not procfs or cgroupfs: not a PSI file", path, fs.Type)
	}
	// Another procfs or cgroup file: some act on any write
	// (memory.force_empty reclaims the cgroup, cgroup.procs moves tasks).
	return fmt.Errorf("pressure: %s is not a PSI file (/proc/pressure/*, a cgroup's *.pressure): no trigger written to it", path)
}

// fileKind names the type of a file mode, for errors.
func fileKind(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "regular file"
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFBLK:
		return "block device"
	case unix.S_IFIFO:
		return "FIFO"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFLNK:
		return "symbolic link"
	}
	return fmt.Sprintf("file of mode %#o", mode&unix.S_IFMT)
}

// openV1 registers an eventfd for the cgroup v1 memory.pressure_level of
// dir (Documentation/admin-guide/cgroup-v1/memory.rst, "Memory Pressure").
func (w *watcher) openV1(dir string) error {
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("pressure: eventfd: %w", err)
	}
	w.fd, w.events = efd, unix.POLLIN
	level := filepath.Join(dir, "memory.pressure_level")
	pfd, err := unix.Open(level, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "pressure: open", Path: level, Err: err}
	}
	w.others = append(w.others, pfd)
	ctl := filepath.Join(dir, "cgroup.event_control")
	line := strconv.Itoa(efd) + " " + strconv.Itoa(pfd) + " " + v1Level
	if err := os.WriteFile(ctl, []byte(line), 0); err != nil {
		return fmt.Errorf("pressure: register %q: %w", line, err)
	}
	return nil
}

// openSystemd opens $MEMORY_PRESSURE_WATCH as systemd's protocol says: a
// socket is connected to and read (POLLIN), a FIFO is read (POLLIN), any
// other file (a PSI file) is opened read-write and polled for POLLPRI; the
// decoded $MEMORY_PRESSURE_WRITE, if any, is written first.
func (w *watcher) openSystemd(path string, write []byte) error {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return &os.PathError{Op: "pressure: stat", Path: path, Err: err}
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFSOCK:
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("pressure: socket: %w", err)
		}
		w.fd, w.events, w.socket = fd, unix.POLLIN, true
		if err := unix.Connect(fd, &unix.SockaddrUnix{Name: path}); err != nil {
			return &os.PathError{Op: "pressure: connect", Path: path, Err: err}
		}
		if err := unix.SetNonblock(fd, true); err != nil {
			return fmt.Errorf("pressure: %w", err)
		}
	case unix.S_IFIFO:
		// Read-write, so that the FIFO never reports POLLHUP for want of a
		// writer.
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return &os.PathError{Op: "pressure: open", Path: path, Err: err}
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
			return &os.PathError{Op: "pressure: write", Path: path, Err: err}
		}
		if st.Mode&unix.S_IFMT == unix.S_IFIFO {
			// The FIFO is open for reading too: what was just written is
			// not a signal from the service manager.
			w.drain()
		}
	}
	return nil
}

// drain consumes what the source has to read and returns how many signals
// it held (the eventfd's counter; 1 for a PSI event or socket data), or
// -1 when the source is gone (EOF on a socket).
func (w *watcher) drain() int64 {
	switch {
	case w.kind == srcV1Level:
		var b [8]byte
		if n, err := unix.Read(w.fd, b[:]); err != nil || n != 8 {
			return 0
		}
		return int64(min(binary.NativeEndian.Uint64(b[:]), 1<<62))
	case w.kind == srcEvents:
		return w.readEvents()
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

// run is the watcher's goroutine. It polls the source with no timeout; on
// a signal it acts, then ignores the source for MinInterval (poll with a
// timeout, on wake only), then looks at it again: signals latched meanwhile
// (the eventfd counter, the PSI event flag) give one more action.
func (w *watcher) run() {
	defer close(w.done)
	m := w.m
	fds := []unix.PollFd{{Fd: int32(w.fd), Events: w.events}, {Fd: int32(w.wake), Events: unix.POLLIN}}
	var until time.Time // end of the quiet interval; zero: none
	inPressure := false
	var stretchSignals, stretchActs, stretchLeft int64
	for {
		timeout := -1
		fds[0].Fd = int32(w.fd)
		if !until.IsZero() {
			if d := time.Until(until); d > 0 {
				timeout = int((d + time.Millisecond - 1) / time.Millisecond)
				fds[0].Fd = -1 // ignored by poll
			} else {
				until = time.Time{}
				timeout = 0 // look once: anything latched?
			}
		}
		fds[0].Revents, fds[1].Revents = 0, 0
		n, err := unix.Poll(fds, timeout)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			m.log.Warn("memctl: memory pressure watcher stopped", "source", w.name, "error", err)
			return
		}
		if fds[1].Revents != 0 {
			return
		}
		if n == 0 {
			if timeout == 0 && inPressure {
				inPressure = false
				m.log.LogAttrs(bg, slog.LevelInfo, "memctl: kernel memory pressure eased", slog.String("source", w.name),
					slog.Int64("signals", stretchSignals), slog.Int64("actions", stretchActs),
					slog.Int64("left_to_kernel", stretchLeft))
			}
			continue
		}
		re := fds[0].Revents
		if w.kind == srcEvents && re&unix.POLLPRI != 0 {
			re &^= unix.POLLERR // kernfs signals a change with POLLERR|POLLPRI
		}
		if re&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0 || re&w.events == 0 {
			m.log.Warn("memctl: memory pressure watcher stopped: source gone", "source", w.name, "revents", re)
			return
		}
		got := w.drain()
		if got < 0 {
			m.log.Warn("memctl: memory pressure watcher stopped: the service manager closed the socket", "source", w.name)
			return
		}
		if got == 0 {
			continue
		}
		m.signals.Add(got)
		stretchSignals += got
		mk := w.readMakeup()
		if !inPressure {
			inPressure, stretchSignals, stretchActs, stretchLeft = true, got, 0, 0
			m.log.LogAttrs(bg, slog.LevelWarn, "memctl: kernel memory pressure", slog.String("source", w.name),
				slog.Int64("anon_bytes", mk.Anon), slog.Int64("page_cache_bytes", mk.Cache), slog.Int64("own_anon_bytes", mk.Own),
				slog.String("makeup_from", mk.From))
		}
		if m.act(w, got, mk) {
			stretchActs++
		} else {
			stretchLeft++
		}
		until = time.Now().Add(m.cfg.MinInterval)
	}
}

// readMakeup reads what the memory under pressure is made of. A read that
// fails, or gives an unknown figure, is an unknown makeup (see
// Makeup.Anonymous: the trim still passes its gate, no request is
// cancelled), and is said in one WARN naming the file when the makeup
// turns unknown, not at each signal; one more when it turns unknown again
// after a good read. Only the watcher's goroutine calls it.
func (w *watcher) readMakeup() Makeup {
	mk, err := w.makeup()
	if err == nil && mk.Known() {
		w.makeupBad = false
		return mk
	}
	mk.Anon, mk.Cache = -1, -1
	if !w.makeupBad {
		w.makeupBad = true
		if err == nil {
			err = errors.New("active_file or inactive_file missing")
		}
		w.m.log.LogAttrs(bg, slog.LevelWarn,
			"memctl: cannot tell what the memory under pressure is made of; pressure trims still pass the trim gate, CancelLargest is held until it can",
			slog.String("source", w.name), slog.String("file", mk.From), slog.Any("error", err))
	}
	return mk
}

// close wakes the goroutine, waits for it and closes the fds.
func (w *watcher) close() {
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	_, _ = unix.Write(w.wake, one[:])
	<-w.done
	w.closeFDs()
}

func (w *watcher) closeFDs() {
	for _, fd := range append([]int{w.fd, w.wake}, w.others...) {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
	}
}

// Why the process's own cgroup is not watched (hostWideNote).
var (
	errNoController = errors.New("no memory controller")
	errNoLimit      = errors.New("no memory limit")
)

// ownError is a reason (errNoController, errNoLimit) with its detail; its
// text is the detail alone, the reason leads the note.
type ownError struct{ reason, detail error }

func (e ownError) Error() string   { return e.detail.Error() }
func (e ownError) Unwrap() []error { return []error{e.reason, e.detail} }

// hostWideNote says why the host-wide PSI is watched instead of the
// process's own cgroup: the read-only mount, no memory controller, no
// limit, or the Config, followed by the errors.
func hostWideNote(w Watch, ownWhy []error) string {
	if w == WatchSystem {
		return "Config.Watch is WatchSystem"
	}
	reason := "no memory controller"
	for _, err := range ownWhy {
		switch {
		case errors.Is(err, unix.EROFS):
			reason = "read-only cgroup mount"
		case errors.Is(err, errNoLimit) && reason != "read-only cgroup mount":
			reason = "no memory limit"
		case errors.Is(err, errNoController):
		default:
			if reason == "no memory controller" {
				reason = "the cgroup's own source failed"
			}
		}
	}
	if len(ownWhy) == 0 {
		return reason
	}
	return reason + ": " + errors.Join(ownWhy...).Error()
}

// psiRefusedNote says in a few words, for the startup line, why the
// cgroup's own PSI trigger was refused when memory.events is watched
// instead: EPERM at a cgroup namespace root (the kernel refuses writes to
// a namespace root's non-delegatable files when cgroup2 is mounted with
// nsdelegate, as systemd mounts it: a process inside a Kubernetes
// container), a read-only mount, no PSI in the kernel, or the error.
func psiRefusedNote(err error, nsRoot bool) string {
	const p = "PSI trigger refused: "
	switch {
	case errors.Is(err, unix.EPERM) && nsRoot:
		return p + "EPERM at the cgroup namespace root (nsdelegate)"
	case errors.Is(err, unix.EROFS):
		return p + "read-only cgroup mount"
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.EOPNOTSUPP):
		return "no PSI in this kernel (CONFIG_PSI off or psi=0)"
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return p + "permission denied"
	}
	return p + err.Error()
}

// makeupFunc returns how the watcher of s reads what the memory under
// pressure is made of: the watched cgroup's memory.stat (for a systemd
// source, the process's own cgroup, own, when known), the host's
// /proc/meminfo and the process's RssAnon for host-wide PSI.
func makeupFunc(m *Monitor, s source, own string) func() (Makeup, error) {
	if m.cfg.makeup != nil {
		return m.cfg.makeup
	}
	dir := s.dir
	if s.kind == srcSystemd {
		if l, err := cgroupfs.Of(0); err == nil {
			dir = l.Dir
		} else {
			dir = own
		}
	}
	if s.hostWide || dir == "" {
		return func() (Makeup, error) { return hostMakeup("/proc/meminfo", "/proc/self/status") }
	}
	return func() (Makeup, error) { return cgroupMakeup(dir) }
}

// openEvents opens a cgroup v2 memory.events file read-only: the kernel
// signals a change of its counters with POLLPRI (kernfs_notify), no write
// needed (Documentation/admin-guide/cgroup-v2.rst: "A value change in this
// file generates a file modified event").
func (w *watcher) openEvents(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "pressure: open", Path: path, Err: err}
	}
	w.fd, w.events = fd, unix.POLLPRI
	e, err := w.preadEvents()
	if err != nil {
		return err
	}
	w.last = e
	return nil
}

// preadEvents reads the memory.events counters from the start of w.fd
// (which also clears kernfs's change flag for the next poll).
func (w *watcher) preadEvents() (cgroupfs.Events, error) {
	var b [1024]byte
	n, err := unix.Pread(w.fd, b[:], 0)
	if err != nil {
		return cgroupfs.Events{}, fmt.Errorf("pressure: read %s: %w", w.name, err)
	}
	return cgroupfs.ParseEvents(bytes.NewReader(b[:n]), w.name)
}

// readEvents returns the growth of the counters that mean pressure
// (eventsGrowth) since the last read.
func (w *watcher) readEvents() int64 {
	e, err := w.preadEvents()
	if err != nil {
		return 0
	}
	d := eventsGrowth(w.last, e)
	w.last = e
	return d
}
