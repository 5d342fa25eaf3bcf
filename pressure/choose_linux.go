package pressure

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/memctl/memctl/internal/cgroupfs"
)

// choice is a pick of the kernel source: the candidates in order, and
// what was learnt of those that could not be used.
type choice struct {
	cands         []source
	why, ownWhy   []error // every failure; those of the process's own cgroup
	psiWhy        error   // why its PSI trigger was refused
	systemdFailed bool    // $MEMORY_PRESSURE_* set but unusable
	own           string  // the process's memory cgroup directory, "" when none
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
		c.addCgroup(m.cfg, w == "auto")
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
func (c *choice) addCgroup(cfg Config, auto bool) {
	l, err := cgroupfs.Of(0)
	switch {
	case err != nil:
		c.ownWhy, c.why = append(c.ownWhy, ownError{errNoController, err}), append(c.why, err)
	case l.Version == 2:
		c.own, c.nsRoot = l.Dir, l.Cgroup == "/"
		p := filepath.Join(l.Dir, "memory.pressure")
		c.cands = append(c.cands, source{kind: srcPSI, path: p, write: psiTrigger(cfg.Stall, cfg.StallWindow),
			dir: l.Dir, name: fmt.Sprintf("cgroup v2 PSI %s (some %v in %v)", p, cfg.Stall, cfg.StallWindow)})
		if l.Bytes != cgroupfs.NoLimit {
			e := filepath.Join(l.Dir, "memory.events")
			c.cands = append(c.cands, source{kind: srcEvents, path: e,
				dir: l.Dir, name: fmt.Sprintf("cgroup v2 %s (high, max, oom)", e)})
		}
	case l.Bytes == cgroupfs.NoLimit && auto:
		c.own = l.Dir
		e := ownError{errNoLimit, fmt.Errorf("pressure: cgroup v1 %s has no memory limit: watching PSI instead", l.Dir)}
		c.ownWhy, c.why = append(c.ownWhy, e), append(c.why, e)
	default:
		c.own = l.Dir
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
	wt := &watcher{m: m, sig: sig, name: s.name, hostWide: s.hostWide, note: c.note(s), makeup: m.makeupFunc(s, c.own)}
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
func (m *Monitor) makeupFunc(s source, own string) func() (makeup, error) {
	if m.deps.makeup != nil {
		return m.deps.makeup
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
