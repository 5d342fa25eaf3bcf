package memctl

import (
	"log/slog"
	"runtime/debug"
	"sync/atomic"

	"github.com/memctl/memctl/internal/trimwire"
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
