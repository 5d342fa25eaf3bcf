package memctl

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/memctl/memctl/internal/trimwire"
	"github.com/memctl/memctl/limits"
	"github.com/memctl/memctl/pressure"
	"github.com/memctl/memctl/trim"
	"github.com/memctl/memctl/trim/cheap"
)

// Report returns what Start decided, and the allocators found now.
func (c *Controller) Report() Report {
	if c == nil {
		return Report{Off: true}
	}
	r := c.report
	if !r.Off {
		for _, h := range cheap.Detect().Heaps() {
			r.CHeaps = append(r.CHeaps, h.Name())
		}
	}
	return r
}

// AfterBurst marks the end of a burst of work: the trim runs once, the trim
// delay after the last AfterBurst (trim.Trimmer.AfterBurst). It allocates
// nothing.
func (c *Controller) AfterBurst() {
	if c != nil && c.trimmer != nil {
		c.trimmer.AfterBurst()
	}
}

// Begin marks a burst in flight: no trim runs until the returned func is
// called (up to trim.Config.MaxWait), which counts as AfterBurst. Calling it
// more than once is misuse (Stats.Misuse; a panic under SetStrict). With no
// trimmer Begin only counts. It allocates nothing.
func (c *Controller) Begin() (end func()) {
	if c == nil || c.trimmer == nil {
		loose.Add(1)
		return looseEnd
	}
	return c.trimmer.Begin()
}

// Bursts begun with no trimmer to take them, and the misuse of their ends.
var (
	loose, looseMisuse atomic.Int64
	looseWarned        atomic.Bool
	strict             atomic.Bool
)

func looseEnd() {
	if loose.Add(-1) >= 0 {
		return
	}
	loose.Add(1)
	looseMisuse.Add(1)
	if strict.Load() {
		panic("memctl: burst ended more often than begun")
	}
	if looseWarned.CompareAndSwap(false, true) {
		slog.Default().Warn("memctl: burst ended more often than begun (an end func called twice?); counted in Stats.Misuse, logged once")
	}
}

// SetStrict turns the strict mode for tests on or off and returns the
// previous setting: misuse (an extra end func of Begin) panics instead of
// being counted and logged. Default off. Safe for concurrent use.
func SetStrict(on bool) (previous bool) { return strict.Swap(on) }

// Stats returns the controller's counters and the C heap's statistics.
func (c *Controller) Stats() Stats {
	s := Stats{GoMemLimit: debug.SetMemoryLimit(-1), Misuse: misuse.Load(), Swap: readSwap()}
	s.CHeap, _ = cheap.Detect().Stats() // all -1 when unavailable
	s.CHeaps = cheap.Detect().Heaps()
	if c != nil && c.trimmer != nil {
		s.Trim = c.trimmer.Stats()
	}
	if c != nil {
		s.Pressure, s.AutoBurst = c.monitor.Stats(), autoBurstStats(c.auto)
	}
	s.Misuse += looseMisuse.Load() + s.Trim.Misuse
	return s
}

// autoBurstStats returns a's counters (zero for nil) without allocating.
func autoBurstStats(a trimwire.AutoBurst) trim.AutoBurstStats {
	if c, ok := a.(interface{ Counters() trim.AutoBurstStats }); ok {
		return c.Counters()
	}
	return trim.AutoBurstStats{}
}

// Close stops the trimmer (a pending trim is dropped, a running one waited
// for), the GOMEMLIMIT refresh and the pressure monitor. The THP flag and
// GOMEMLIMIT stay as they are. Idempotent; it returns nil.
func (c *Controller) Close() error {
	if c == nil {
		return nil
	}
	c.once.Do(func() {
		unregister(c)
		c.rec.sub.Stop() // before the trimmer's Close: no republish after it
		_ = c.monitor.Close()
		if c.untrim != nil {
			c.untrim()
		}
		if c.auto != nil {
			c.auto.Close()
		}
		c.limiter.Close()
		if c.trimmer != nil {
			_ = c.trimmer.Close()
		}
		c.stopRecord()
		c.hist.Close()
	})
	return nil
}

// AfterBurst calls AfterBurst on the live controller of the latest Start;
// with none it is a wiring mistake (see the package doc).
func AfterBurst() {
	if c := current.Load(); c != nil {
		c.AfterBurst()
		return
	}
	noController("AfterBurst")
}

// Begin calls Begin on the live controller of the latest Start; with none it
// is a wiring mistake and only counts.
func Begin() (end func()) {
	c := current.Load()
	if c == nil {
		noController("Begin")
	}
	return c.Begin()
}

// CurrentStats returns the Stats of the live controller of the latest Start,
// or with none the counters kept without one.
func CurrentStats() Stats { return current.Load().Stats() }

var (
	current atomic.Pointer[Controller] // the last of live (started, not closed)
	liveMu  sync.Mutex
	live    []*Controller

	misuse       atomic.Int64
	warnedNoCtl  atomic.Bool
	warnedSecond atomic.Bool
)

// register makes c the live controller, warning once if another is live.
func register(c *Controller, l *slog.Logger) {
	liveMu.Lock()
	var prev *Controller
	if n := len(live); n > 0 {
		prev = live[n-1]
	}
	live = append(live, c)
	current.Store(c)
	liveMu.Unlock()
	if prev == nil {
		return
	}
	misuse.Add(1)
	if !warnedSecond.Swap(true) {
		l.Warn("memctl: Start called while an earlier controller is live (a second Start, or Start beside the auto package); "+
			"the newest now serves memctl.AfterBurst and memctl.Begin, and both run until their Close",
			"earlier_start", prev.startedBy, "this_start", c.startedBy)
	}
}

// unregister hands the package-level functions to the latest live controller.
func unregister(c *Controller) {
	liveMu.Lock()
	defer liveMu.Unlock()
	if i := slices.Index(live, c); i >= 0 {
		live = slices.Delete(live, i, i+1)
	}
	current.Store(nil)
	if n := len(live); n > 0 {
		current.Store(live[n-1])
	}
}

func noController(fn string) {
	misuse.Add(1)
	if !warnedNoCtl.Load() && !warnedNoCtl.Swap(true) {
		slog.Default().Warn("memctl: " + fn + " called with no live controller: nothing will be trimmed; " +
			"call memctl.Start at the top of main (or import github.com/memctl/memctl/auto) and Close it at exit")
	}
}

// caller names the function skip frames up: "main.main (main.go:12)".
func caller(skip int) string {
	pc, file, line, ok := runtime.Caller(skip)
	if !ok {
		return "unknown"
	}
	name := "unknown"
	if f := runtime.FuncForPC(pc); f != nil {
		name = f.Name()
	}
	return fmt.Sprintf("%s (%s:%d)", name, filepath.Base(file), line)
}

// MemLimit returns the limiter's latest GOMEMLIMIT decision; it reads and
// allocates nothing. With no limiter it holds GOMEMLIMIT alone.
func (c *Controller) MemLimit() limits.MemLimit {
	if c == nil || c.limiter == nil {
		return limits.MemLimit{GoMemLimit: debug.SetMemoryLimit(-1), Source: limits.SourceNone}
	}
	return c.limiter.Last()
}

// WatchMemLimit returns a channel that receives MemLimit at each change, as
// limits.MemLimiter.Subscribe. Close closes it; with no limiter it is closed
// at once.
func (c *Controller) WatchMemLimit(buf int) (changes <-chan limits.MemLimit, cancel func()) {
	var m *limits.MemLimiter
	if c != nil {
		m = c.limiter
	}
	return m.Subscribe(buf)
}

// CurrentMemLimit returns MemLimit of the live controller of the latest
// Start; with none, GOMEMLIMIT alone.
func CurrentMemLimit() limits.MemLimit { return current.Load().MemLimit() }

// WatchMemLimit returns WatchMemLimit of the live controller of the latest
// Start; with none, a closed channel.
func WatchMemLimit(buf int) (changes <-chan limits.MemLimit, cancel func()) {
	return current.Load().WatchMemLimit(buf)
}

// Refresh re-reads the memory limit now and sets GOMEMLIMIT
// (limits.MemLimiter.Refresh). With no limiter it changes nothing and returns
// GOMEMLIMIT as it is.
func (c *Controller) Refresh() (limits.MemLimit, error) {
	if c == nil || c.limiter == nil {
		return limits.MemLimit{GoMemLimit: debug.SetMemoryLimit(-1)}, nil
	}
	return c.limiter.Refresh()
}

// Subscribe returns a channel of the death-spiral and kernel-pressure events,
// as pressure.Monitor.Subscribe; Close closes it. With no monitor it is closed
// at once.
func (c *Controller) Subscribe(buf int) (events <-chan pressure.Event, cancel func()) {
	var m *pressure.Monitor
	if c != nil {
		m = c.monitor
	}
	return m.Subscribe(buf)
}
