package memctl

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/gcend"
	"github.com/memctl/memctl/internal/gomemlimit"
	"github.com/memctl/memctl/internal/poolwire"
	"github.com/memctl/memctl/internal/procfs"
	"github.com/memctl/memctl/internal/state"
	"github.com/memctl/memctl/limits"
	"github.com/memctl/memctl/trim"
)

// recorder publishes a controller's state record (package internal/state;
// when: docs/command.md).
type recorder struct {
	sub *gcend.Subscription
	// watchMu guards the fingerprints last published, when counters were,
	// and flush, the timer for held-back counters; Close waits on flushes.
	lastDecisions, lastCounters uint64
	countersAt                  time.Time
	watchMu                     sync.Mutex
	flush                       *time.Timer
	flushes                     sync.WaitGroup
	warned                      atomic.Bool
	closed                      atomic.Bool
	started                     atomic.Bool // startRecord set log: publish may run
	log                         *slog.Logger
}

// record returns c's state record (nil c: none live), cut to the state limits.
func (c *Controller) record() *state.Record {
	cut := state.Cut
	r := &state.Record{PID: os.Getpid(), Pressure: state.Pressure{Source: "none"}, CHeap: "none"}
	gml := debug.SetMemoryLimit(-1)
	if gml != math.MaxInt64 {
		r.GoMemLimit.Bytes = &gml
	}
	if c == nil {
		r.Closed = true
		r.GoMemLimit.Source = limits.SourceNone.String()
		r.GoMemLimit.Reason = "no memctl controller is live"
	} else {
		rep, st := c.report, c.Stats()
		ml := rep.MemLimit
		if l := c.limiter.Last(); l.Reason != "" {
			ml = l // the refresh's latest decision
		}
		r.Off, r.Closed = rep.Off, c.rec.closed.Load()
		r.GoMemLimit = state.GoMemLimit{Bytes: r.GoMemLimit.Bytes, Source: cut(ml.Source.String()), File: cut(ml.File),
			MemoryLimitBytes: ml.MemoryLimit, Ratio: ml.Ratio, OutsideBytes: ml.Outside,
			RefreshSeconds: rep.MemLimitRefresh.Seconds(), Reason: cut(ml.Reason), LimitUnknown: ml.LimitUnknown,
			ReclaimableBytes: ml.Reclaimable, Overridden: ml.Overridden}
		if gomemlimit.IsSet(ml.Operator) {
			r.GoMemLimit.OperatorBytes = &ml.Operator
		}
		r.THP = state.THP{Policy: cut(rep.THPPolicy.String()), State: cut(rep.THPState.String()), System: cut(rep.THPSystem)}
		t := st.Trim
		origin := func(s trim.OriginStats) state.Origin {
			return state.Origin{Trims: s.Trims, Skipped: s.Skipped, CPUSeconds: s.CPU.Seconds(), ReleasedBytes: s.Released}
		}
		r.Trim = state.Trim{DelaySeconds: rep.TrimDelay.Seconds(), Trims: t.Trims, Skipped: t.Skipped,
			GoSkipped: t.GoSkipped, CSkipped: t.CSkipped, ReleasedBytes: t.TotalReleased,
			LastReleasedBytes: t.LastReleased, CPUSeconds: t.TotalCPU.Seconds(),
			Deferred: t.Deferred, EarlyStarts: t.EarlyStarts,
			Origins: state.Origins{Debounced: origin(t.Debounced), Pressure: origin(t.Pressure),
				Spiral: origin(t.Spiral), ByName: origin(t.ByName)},
			SkippedBy: state.SkippedBy{MinRelease: t.SkippedMinRelease, Cost: t.SkippedCost,
				Budget: t.SkippedBudget, Running: t.SkippedRunning}}
		ps := st.Pressure
		r.Pressure = state.Pressure{Source: cut(cmp.Or(rep.Pressure, "none")), Note: cut(rep.PressureNote), Signals: ps.Signals, Acted: ps.Acted,
			LeftToKernel: ps.LeftToKernel, CancelsHeld: ps.CancelsHeld, Spirals: ps.Spirals, Lifts: ps.Lifts,
			LiftedBytes: max(ps.Lifted, 0)}
		r.CHeap = cut(cmp.Or(rep.CHeap, "none"))
		for _, h := range st.CHeaps {
			if len(r.CHeaps) == state.MaxCHeaps {
				r.CHeapsOmitted++
				continue
			}
			r.CHeaps = append(r.CHeaps, state.CHeap{Allocator: cut(h.Allocator), Library: cut(h.Library),
				OwnsMalloc: h.OwnsMalloc, Trimmed: h.Trimmed, Note: cut(h.Note), Releases: h.Releases,
				Skipped: h.Skipped, ReleasedBytes: max(h.TotalReleased, 0), RetainedBytes: max(h.Retained, -1)})
		}
		r.Swap = swapRecord(st.Swap)
		a := st.AutoBurst
		r.AutoBurst = state.AutoBurst{Bursts: a.Bursts, Drops: a.Drops, Marks: a.Marks, Settled: a.Settled,
			FloorBytes: max(a.Floor, 0), GCEnds: a.GCEnds}
	}
	for _, v := range poolwire.Pools() {
		p := v.(*limits.Pool)
		if len(r.Pools) == state.MaxPools {
			r.PoolsOmitted++
			continue
		}
		s := p.Stats()
		sp := state.Pool{Name: cut(s.Name), Mode: cut(s.Mode.String()), UsedBytes: max(s.Used, 0),
			PeakBytes: max(s.Peak, 0), InFlight: max(s.InFlight, 0), Refused: s.Refused, Observed: s.Observed,
			Canceled: s.Canceled, Undercharged: s.Undercharged}
		if s.Limit != limits.Unlimited {
			sp.LimitBytes = &s.Limit
		}
		sp.Peaks.Set(slices.Clone(s.Peaks.Counts[:]))
		r.Pools = append(r.Pools, sp)
	}
	return r
}

// publish republishes the live controller's record, or c's when none is
// live and c is closed; a failure other than ErrUnsupported is logged once
// at INFO.
func (c *Controller) publish() {
	live := current.Load()
	if live == nil && c != nil && c.rec.closed.Load() {
		live = c
	}
	err := state.Publish(live.record())
	if err == nil || errors.Is(err, errors.ErrUnsupported) || c == nil {
		return
	}
	if !c.rec.warned.Swap(true) {
		c.rec.log.Info("memctl: state record not published (memctl status -pid will not show it)", "error", err)
	}
}

// countersEvery is the least time between two records published for
// changed counters alone; a changed decision is published at once.
const countersEvery = time.Second

// startRecord publishes c's first record and, unless off, watches GC ends.
func (c *Controller) startRecord(l *slog.Logger) {
	c.rec.log = l
	c.rec.started.Store(true)
	if c.report.Off {
		c.publish() // MEMCTL=off: one record that says so, and no watch
		return
	}
	c.rec.lastDecisions, c.rec.lastCounters = c.fingerprint()
	c.rec.countersAt = time.Now()
	c.rec.sub = gcend.Subscribe(func(s *gcend.Sample) bool {
		if !c.histOff.Load() {
			c.hist.GCEnd(s.Time, s.Live, s.GoMemLimit)
		}
		c.watch(false)
		return true
	})
	c.publish()
}

// watch publishes the record when the decisions changed, or the counters
// did and countersEvery passed; held-back counters are published by a timer
// (flush is true in its call).
func (c *Controller) watch(flush bool) {
	c.rec.watchMu.Lock()
	defer c.rec.watchMu.Unlock()
	if flush {
		c.rec.flush = nil
	}
	if c.rec.closed.Load() {
		return
	}
	d, n := c.fingerprint()
	if d == c.rec.lastDecisions && n == c.rec.lastCounters {
		return
	}
	now := time.Now()
	if wait := countersEvery - now.Sub(c.rec.countersAt); d == c.rec.lastDecisions && wait > 0 {
		if c.rec.flush == nil {
			c.rec.flushes.Add(1)
			c.rec.flush = time.AfterFunc(wait, func() {
				defer c.rec.flushes.Done()
				c.watch(true)
			})
		}
		return
	}
	c.rec.lastDecisions, c.rec.lastCounters, c.rec.countersAt = d, n, now
	c.publish()
}

// mark records an event in the history and republishes the record.
func (c *Controller) mark(k eventKind) {
	c.hist.Mark(time.Now(), k, gomemlimit.Read())
	c.publish()
}

// stopRecord stops the watch and republishes (the live controller's, or c's last).
func (c *Controller) stopRecord() {
	c.rec.closed.Store(true)
	c.rec.watchMu.Lock()
	if c.rec.flush != nil && c.rec.flush.Stop() {
		c.rec.flushes.Done() // stopped before its func ran
	}
	c.rec.flush = nil
	c.rec.watchMu.Unlock()
	c.rec.flushes.Wait()
	c.publish()
}

// fingerprint hashes the record's decisions and its counters.
func (c *Controller) fingerprint() (decisions, counters uint64) {
	d, n := uint64(debug.SetMemoryLimit(-1)), uint64(0)
	mix := func(h *uint64, v int64) { *h = *h*1000003 ^ uint64(v) }
	for _, v := range poolwire.Pools() {
		p := v.(*limits.Pool)
		s := p.Stats()
		mix(&d, s.Limit)
		mix(&d, int64(len(s.Name)))
		for _, v := range []int64{s.Refused, s.Observed, s.Canceled, s.Undercharged, s.Peaks.Count} {
			mix(&n, v)
		}
	}
	ps, a := c.monitor.Counters(), autoBurstStats(c.auto)
	for _, v := range []int64{ps.Signals, ps.Acted, ps.LeftToKernel, ps.CancelsHeld, ps.Spirals, ps.Lifts, ps.Lifted,
		a.Bursts, a.Drops, a.Settled} {
		mix(&n, v)
	}
	return d, n
}

// SwapStats is the swap of the process and of its cgroup (Stats.Swap), in
// bytes, -1 when unknown. GOMEMLIMIT does not count swap.
type SwapStats struct {
	VmSwap int64 // VmSwap of /proc/self/status
	// CgroupVersion is 2 (memory.swap.*), 1 (memory.memsw.*: memory plus
	// swap), or 0 when none were read (CgroupErr says why).
	CgroupVersion int
	// Current is memory.swap.current or memory.memsw.usage_in_bytes; Max the
	// cgroup's own memory.swap.max or memory.memsw.limit_in_bytes (-1: none).
	Current, Max         int64
	CurrentFile, MaxFile string // the files read
	CgroupErr            error
}

// ownCgroup is the cgroup swap is read from, found at the first read.
var ownCgroup = sync.OnceValues(func() (cgroupfs.Limit, error) { return cgroupfs.Of(0) })

// readSwap returns the process's SwapStats. Safe for concurrent use.
func readSwap() SwapStats {
	st := SwapStats{VmSwap: -1, Current: -1, Max: -1}
	if v, err := procfs.ReadBytes("/proc/self/status", "VmSwap"); err == nil {
		st.VmSwap = v
	}
	cg, err := ownCgroup()
	if err != nil {
		st.CgroupErr = err
		return st
	}
	sw, err := cgroupfs.ReadSwap(cg.Version, cg.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		cur, max := cgroupfs.SwapFiles(cg.Version)
		err = fmt.Errorf("memctl: no %s or %s in %s: %s: %w", cur, max, cg.Dir, state.NoSwapAccounting, err)
	}
	if err != nil {
		st.CgroupErr = err
		return st
	}
	st.CgroupVersion, st.Current, st.Max, st.CurrentFile, st.MaxFile = sw.Version, sw.Current, sw.Max, sw.CurrentFile, sw.MaxFile
	return st
}

// swapRecord returns s as the state record's swap.
func swapRecord(s SwapStats) *state.Swap {
	r := &state.Swap{}
	if s.VmSwap >= 0 {
		r.VmSwapBytes = &s.VmSwap
	}
	if s.CgroupVersion == 0 {
		if s.CgroupErr != nil {
			r.Note = state.Cut(s.CgroupErr.Error())
		}
		return r
	}
	r.CgroupVersion, r.CurrentBytes, r.File = s.CgroupVersion, &s.Current, state.Cut(s.CurrentFile)
	r.MemoryPlusSwap = s.CgroupVersion == 1
	if s.Max >= 0 {
		r.MaxBytes = &s.Max
	}
	return r
}
