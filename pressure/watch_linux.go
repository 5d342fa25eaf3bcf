package pressure

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/logattr"
)

// procPressure is the system-wide memory PSI file (Linux 4.20 and later,
// CONFIG_PSI).
const procPressure = "/proc/pressure/memory"

// watcher is the kernel watcher: one goroutine blocked in poll(2) on the
// source and on wake, an eventfd that close writes to.
type watcher struct {
	m        *Monitor
	sig      *signal
	name     string
	note     string // why the process's own cgroup is not watched (SourceNote)
	hostWide bool   // the system-wide PSI: the host's pressure
	// makeup reads what the memory is made of; makeupBad: it cannot now.
	makeup    func() (makeup, error)
	makeupBad bool
	wake      int
	done      chan struct{}
}

// stretch is a stretch of pressure: from the first signal to the first
// look after MinInterval that finds none.
type stretch struct {
	in                  bool
	signals, acts, left int64
}

// run is the watcher's goroutine. On a signal it acts, then ignores the
// source for MinInterval, then looks again: signals latched meanwhile (the
// eventfd counter, the PSI event flag) give one more action. An unexplained
// PSI event gets one more look a window later (recheck): the kernel sends no
// event for a window after one, so a real stall just after would be missed.
func (w *watcher) run() {
	defer close(w.done)
	fds := []unix.PollFd{w.sig.pollFd(), {Fd: int32(w.wake), Events: unix.POLLIN}}
	fd := fds[0].Fd
	var until, recheck time.Time // end of the quiet interval, the look after an ignored event; zero: none
	var st stretch
	for {
		timeout, look := -1, false
		fds[0].Fd = fd
		if !until.IsZero() {
			if d := time.Until(until); d > 0 {
				timeout = ceilMillis(d)
				fds[0].Fd = -1 // ignored by poll
			} else {
				until, timeout, look = time.Time{}, 0, true // look once: anything latched?
			}
		}
		if !recheck.IsZero() && timeout != 0 {
			if d := ceilMillis(time.Until(recheck)); timeout < 0 || d < timeout {
				timeout = d
			}
		}
		fds[0].Revents, fds[1].Revents = 0, 0
		n, err := unix.Poll(fds, timeout)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			w.m.log.Warn("memctl: memory pressure watcher stopped", "source", w.name, "error", err)
			return
		case fds[1].Revents != 0:
			return
		case n == 0:
			if !recheck.IsZero() && !time.Now().Before(recheck) {
				recheck = time.Time{}
				if _, _, ignore := w.sig.unexplained(); !ignore {
					w.respond(1, &st)
					until, look = time.Now().Add(w.m.cfg.MinInterval), false
				}
			}
			if look {
				w.eased(&st)
			}
			continue
		}
		handled, ignored, stop := w.signal(fds[0].Revents, &st)
		switch {
		case stop:
			return
		case handled:
			until, recheck = time.Now().Add(w.m.cfg.MinInterval), time.Time{}
		case ignored:
			recheck = time.Now().Add(w.sig.window())
		}
	}
}

// ceilMillis returns d in whole milliseconds, rounded up, at least 0.
func ceilMillis(d time.Duration) int {
	return int(max(0, (d+time.Millisecond-1)/time.Millisecond))
}

// signal drains the source, checks a PSI event against the stall since arming
// and responds. handled: a signal was answered; ignored: a PSI event the stall
// does not explain; stop: the source is gone.
func (w *watcher) signal(re int16, st *stretch) (handled, ignored, stop bool) {
	m := w.m
	if w.sig.gone(re) {
		m.log.Warn("memctl: memory pressure watcher stopped: source gone", "source", w.name, "revents", re)
		return false, false, true
	}
	got := w.sig.drain()
	switch {
	case got < 0:
		m.log.Warn("memctl: memory pressure watcher stopped: the service manager closed the socket", "source", w.name)
		return false, false, true
	case got == 0:
		return false, false, false
	}
	if since, threshold, ignore := w.sig.unexplained(); ignore {
		m.unexplained.Add(1)
		m.log.LogAttrs(bg, slog.LevelDebug, "memctl: PSI event ignored: the stall since the trigger was armed does not explain it; looked at again a window later",
			slog.String("source", w.name), slog.Duration("stall_since_armed", since), slog.Duration("threshold", threshold))
		return false, true, false
	}
	w.respond(got, st)
	return true, false, false
}

// respond counts got signals, opens a stretch of pressure if needed and acts.
func (w *watcher) respond(got int64, st *stretch) {
	m := w.m
	m.signals.Add(got)
	mk := w.readMakeup()
	if !st.in {
		*st = stretch{in: true}
		w.logPressure(mk)
	}
	st.signals += got
	if m.act(w, got, mk) {
		st.acts++
	} else {
		st.left++
	}
}

// eased logs the end of a stretch of pressure, if one is in progress.
func (w *watcher) eased(st *stretch) {
	if !st.in {
		return
	}
	st.in = false
	w.m.log.LogAttrs(bg, slog.LevelInfo, "memctl: kernel memory pressure eased", slog.String("source", w.name),
		slog.Int64("signals", st.signals), slog.Int64("actions", st.acts), slog.Int64("left_to_kernel", st.left))
}

// logPressure logs the WARN that opens a stretch of pressure, with the memory's
// makeup ("unknown", never -1); own_anon_bytes is for host-wide PSI only.
func (w *watcher) logPressure(mk makeup) {
	attrs := []slog.Attr{slog.String("source", w.name),
		logattr.Bytes("anon_bytes", mk.Anon), logattr.Bytes("page_cache_bytes", mk.Cache)}
	if w.hostWide {
		attrs = append(attrs, logattr.Bytes("own_anon_bytes", mk.Own))
	}
	attrs = append(attrs, slog.String("makeup_from", mk.From))
	w.m.log.LogAttrs(bg, slog.LevelWarn, "memctl: kernel memory pressure", attrs...)
}

// readMakeup reads the memory's makeup; a failure is an unknown makeup, with
// one WARN naming the file each time it turns unknown. Watcher goroutine only.
func (w *watcher) readMakeup() makeup {
	mk, err := w.makeup()
	if err == nil && mk.known() {
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
	_ = unix.Close(w.wake)
	w.sig.close()
}

// choice is a pick of the kernel source: the candidates in order, and
// what was learnt of those that could not be used.
type choice struct {
	cands         []source
	why, ownWhy   []error // every failure; those of the process's own cgroup
	psiWhy        error   // why its PSI trigger was refused
	systemdFailed bool    // $MEMORY_PRESSURE_* set but unusable
	nsRoot        bool    // the process's cgroup is its namespace root, "/"
}

// startWatcher opens the first working source Config.Watch allows and starts
// its goroutine; on failure, an error naming each source tried.
func startWatcher(m *Monitor) (*watcher, error) {
	var c choice
	w := m.cfg.Watch
	if w == "auto" || w == "systemd" {
		if off := c.addSystemd(m.deps.getenv, w == "systemd"); off {
			m.log.Debug("memctl: memory pressure watching turned off by the service manager ($MEMORY_PRESSURE_WATCH=/dev/null)")
			return nil, nil
		}
	}
	if w == "auto" || w == "cgroup" {
		c.addCgroup(m.cg, m.cgErr, m.cfg, w == "auto")
	}
	if w == "auto" || w == "system" {
		c.cands = append(c.cands, source{kind: srcPSI, path: procPressure, write: psiTrigger(m.cfg.Stall, m.cfg.StallWindow),
			hostWide: true, name: fmt.Sprintf("host-wide PSI %s (some %v in %v)", procPressure, m.cfg.Stall, m.cfg.StallWindow)})
	}
	for _, s := range c.cands {
		sig, err := openSignal(s)
		if err != nil {
			c.failed(s, err)
			continue
		}
		return m.startOn(sig, s, &c)
	}
	if len(c.why) == 0 {
		return nil, ErrNoSource
	}
	return nil, fmt.Errorf("%w: %w", ErrNoSource, errors.Join(c.why...))
}

// addSystemd adds the source $MEMORY_PRESSURE_WATCH names, if set; off
// reports that the service manager turned watching off.
func (c *choice) addSystemd(getenv func(string) string, only bool) (off bool) {
	s, ok, off, err := systemdEnv(getenv)
	switch {
	case off:
		return true
	case err != nil:
		c.why, c.systemdFailed = append(c.why, err), true
	case ok:
		s.name = "systemd " + s.path
		c.cands = append(c.cands, s)
	case only:
		c.why, c.systemdFailed = append(c.why, errors.New("pressure: $MEMORY_PRESSURE_WATCH is not set")), true
	}
	return false
}

// addCgroup adds the process's memory cgroup's sources: v2 memory.pressure
// and, with a limit, memory.events (read-only: usable where memory.pressure
// cannot be opened for writing); v1 memory.pressure_level with a limit
// (without one, "low" fires on any reclaim of the host's page cache, so
// auto goes on to PSI, which measures stalls).
func (c *choice) addCgroup(l cgroupfs.Limit, err error, cfg Config, auto bool) {
	switch {
	case err != nil:
		c.ownWhy, c.why = append(c.ownWhy, ownError{errNoController, err}), append(c.why, err)
	case l.Version == 2:
		c.nsRoot = l.Cgroup == "/"
		p := filepath.Join(l.Dir, "memory.pressure")
		c.cands = append(c.cands, source{kind: srcPSI, path: p, write: psiTrigger(cfg.Stall, cfg.StallWindow),
			dir: l.Dir, name: fmt.Sprintf("cgroup v2 PSI %s (some %v in %v)", p, cfg.Stall, cfg.StallWindow)})
		if l.Bytes != cgroupfs.NoLimit {
			e := filepath.Join(l.Dir, "memory.events")
			c.cands = append(c.cands, source{kind: srcEvents, path: e,
				dir: l.Dir, name: fmt.Sprintf("cgroup v2 %s (high, max, oom)", e)})
		}
	case l.Bytes == cgroupfs.NoLimit && auto:
		e := ownError{errNoLimit, fmt.Errorf("pressure: cgroup v1 %s has no memory limit: watching PSI instead", l.Dir)}
		c.ownWhy, c.why = append(c.ownWhy, e), append(c.why, e)
	default:
		c.cands = append(c.cands, source{kind: srcV1Level, path: l.Dir,
			dir: l.Dir, name: fmt.Sprintf("cgroup v1 %s/memory.pressure_level %s", l.Dir, v1Level)})
	}
}

// failed records that s could not be opened.
func (c *choice) failed(s source, err error) {
	c.why = append(c.why, err)
	if s.kind == srcSystemd {
		c.systemdFailed = true
	} else {
		c.ownWhy = append(c.ownWhy, err)
	}
	if s.kind == srcPSI && !s.hostWide {
		c.psiWhy = err
	}
}

// note says why the source s is watched rather than the process's own
// cgroup's PSI trigger, "" when it is that or systemd's.
func (c *choice) note(s source) string {
	switch {
	case s.hostWide && errors.Is(c.psiWhy, unix.EPERM) && c.nsRoot:
		// A container whose limit is out of sight (above its namespace root).
		return psiRefusedNote(c.psiWhy, c.nsRoot) + "; no limit in sight to watch memory.events for"
	case s.hostWide:
		return hostWideNote(c.ownWhy)
	case s.kind == srcEvents && c.psiWhy != nil:
		return psiRefusedNote(c.psiWhy, c.nsRoot)
	}
	return ""
}

// startOn starts the watcher of the source s, open as sig.
func (m *Monitor) startOn(sig *signal, s source, c *choice) (*watcher, error) {
	wt := &watcher{m: m, sig: sig, name: s.name, hostWide: s.hostWide, note: c.note(s), makeup: m.makeupFunc(s)}
	if m.cfg.Watch == "system" {
		wt.note = `Config.Watch is "system"`
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		sig.close()
		return nil, fmt.Errorf("pressure: eventfd: %w", err)
	}
	wt.wake, wt.done = wake, make(chan struct{})
	if len(c.why) > 0 {
		// WARN when the service manager named a source not followed, else DEBUG.
		level := slog.LevelDebug
		if c.systemdFailed {
			level = slog.LevelWarn
		}
		m.log.Log(bg, level, "memctl: memory pressure source skipped", "using", wt.name, "error", errors.Join(c.why...))
	}
	if sig.noCheck != "" {
		m.log.Debug("memctl: PSI events are not checked against the stall since arming", "source", wt.name, "reason", sig.noCheck)
	}
	go wt.run()
	return wt, nil
}

// makeupFunc returns the makeup reader for s: the watched cgroup's memory.stat
// (systemd's: the process's own), or /proc/meminfo and RssAnon host-wide.
func (m *Monitor) makeupFunc(s source) func() (makeup, error) {
	if m.deps.makeup != nil {
		return m.deps.makeup
	}
	dir := s.dir
	if s.kind == srcSystemd && m.cgErr == nil {
		dir = m.cg.Dir
	}
	if s.hostWide || dir == "" {
		return func() (makeup, error) { return hostMakeup("/proc/meminfo", "/proc/self/status") }
	}
	return func() (makeup, error) { return cgroupMakeup(dir) }
}

// Why the process's own cgroup is not watched (hostWideNote).
var (
	errNoController = errors.New("no memory controller")
	errNoLimit      = errors.New("no memory limit")
)

// ownError is a reason (errNoController, errNoLimit) with its detail, its text.
type ownError struct{ reason, detail error }

func (e ownError) Error() string   { return e.detail.Error() }
func (e ownError) Unwrap() []error { return []error{e.reason, e.detail} }

// hostWideNote says why the host-wide PSI is watched instead of the process's
// own cgroup (read-only mount, no limit, no controller, ...), then the errors.
func hostWideNote(ownWhy []error) string {
	reason := "no memory controller"
	for _, err := range ownWhy {
		switch {
		case errors.Is(err, unix.EROFS):
			reason = "read-only cgroup mount"
		case errors.Is(err, errNoLimit) && reason != "read-only cgroup mount":
			reason = "no memory limit"
		case errors.Is(err, errNoController):
		case reason == "no memory controller":
			reason = "the cgroup's own source failed"
		}
	}
	if len(ownWhy) == 0 {
		return reason
	}
	return reason + ": " + errors.Join(ownWhy...).Error()
}

// psiRefusedNote says why the cgroup's own PSI trigger was refused. EPERM at a
// namespace root: cgroup2 mounted with nsdelegate, as systemd does (Kubernetes).
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

// response is what to do on a signal: act (a trim through its gate and the
// event) and cancel the largest request.
type response struct{ act, cancel bool }

// respond decides the response to a signal whose memory is mk
// (docs/pressure.md). A cgroup's memory known to be mostly page cache is left
// to the kernel; an unknown makeup asks for the trim, whose gate decides. A
// request is cancelled only for memory known mostly anonymous and, host-wide,
// mostly this process's.
func respond(mk makeup, hostWide bool) response {
	anon := mk.anonymous()
	if mk.known() && !anon && !hostWide {
		return response{}
	}
	return response{act: true, cancel: anon && (!hostWide || mk.ownsHostAnon())}
}

// act answers signals of w whose memory is mk (respond), and reports
// whether it acted.
func (m *Monitor) act(w *watcher, signals int64, mk makeup) bool {
	r := respond(mk, w.hostWide)
	if !r.act {
		m.leftToKernel.Add(1)
		return false
	}
	m.acted.Add(1)
	m.deps.trim()
	if r.cancel {
		m.deps.cancel()
	} else {
		m.held.Add(1)
	}
	e := Event{Kind: KindKernel, Time: time.Now(), Source: w.name, Signals: signals}
	e.Makeup = mk
	m.publish(e)
	return true
}
