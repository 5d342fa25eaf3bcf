package memctl

import (
	"cmp"
	"errors"
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"github.com/memctl/memctl/internal/gcend"
	"github.com/memctl/memctl/internal/state"
	"github.com/memctl/memctl/limits"
)

// The state record: what the controller decided, published for `memctl
// status -pid` (package internal/state: a sealed memfd, replaced whole) at
// Start, after each trim and skipped trim, when GOMEMLIMIT or the set of
// pools changed at the end of a GC cycle, and at Close. Nothing runs on a
// timer or on the hot paths.

// recorder is a controller's part of the state record.
type recorder struct {
	mu     sync.Mutex
	sub    *gcend.Subscription
	last   uint64 // fingerprint of what the GC-end watch compares
	warned bool
	closed atomic.Bool
	log    *slog.Logger
}

// record returns the state record of c (nil c: no controller live).
func (c *Controller) record() *state.Record {
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
		r.GoMemLimit = state.GoMemLimit{Bytes: r.GoMemLimit.Bytes, Source: ml.Source.String(), File: ml.File,
			MemoryLimitBytes: ml.MemoryLimit, Ratio: ml.Ratio, OutsideBytes: ml.Outside,
			RefreshSeconds: rep.MemLimitRefresh.Seconds(), Reason: ml.Reason}
		r.THP = state.THP{Policy: rep.THPPolicy.String(), State: rep.THPState.String(), System: rep.THPSystem}
		t := st.Trim
		r.Trim = state.Trim{DelaySeconds: rep.TrimDelay.Seconds(), Trims: t.Trims, Skipped: t.Skipped,
			GoSkipped: t.GoSkipped, CSkipped: t.CSkipped, ReleasedBytes: t.TotalReleased,
			LastReleasedBytes: t.LastReleased, CPUSeconds: t.TotalCPU.Seconds(),
			Deferred: t.Deferred, EarlyStarts: t.EarlyStarts}
		r.Pressure.Source = cmp.Or(rep.Pressure, "none")
		r.CHeap = cmp.Or(rep.CHeap, "none")
	}
	for _, p := range limits.Pools() {
		if len(r.Pools) == state.MaxPools {
			r.PoolsOmitted++
			continue
		}
		sp := state.Pool{Name: p.Name(), Mode: p.Mode().String()}
		if l := p.Limit(); l != limits.Unlimited {
			sp.LimitBytes = &l
		}
		r.Pools = append(r.Pools, sp)
	}
	return r
}

// publish republishes the record of the controller that serves the
// package-level functions (or says none is live). A failure other than
// "unsupported here" is logged once at INFO through c's logger.
func (c *Controller) publish() {
	err := state.Publish(current.Load().recordOr(c))
	if err == nil || errors.Is(err, errors.ErrUnsupported) || c == nil {
		return
	}
	c.rec.mu.Lock()
	warned := c.rec.warned
	c.rec.warned = true
	c.rec.mu.Unlock()
	if !warned {
		c.rec.log.Info("memctl: state record not published (memctl status -pid will not show it)", "error", err)
	}
}

// recordOr returns the record of c, or of closed when c is nil and closed
// was the last controller (so that its final counters stay visible).
func (c *Controller) recordOr(closed *Controller) *state.Record {
	if c == nil && closed != nil && closed.rec.closed.Load() {
		return closed.record()
	}
	return c.record()
}

// startRecord publishes c's first record and watches, at the end of each GC
// cycle, for a change of GOMEMLIMIT or of the pools (an atomic read and a
// short list; no goroutine, no timer). A controller that MEMCTL=off
// switched off publishes once and watches nothing.
func (c *Controller) startRecord(l *slog.Logger) {
	c.rec.log = l
	if c.report.Off {
		c.publish() // MEMCTL=off: one record that says so, and no watch
		return
	}
	c.rec.last = fingerprint()
	c.rec.sub = gcend.Subscribe(func() bool {
		if f := fingerprint(); f != c.rec.last {
			c.rec.last = f
			c.publish()
		}
		return true
	})
	c.publish()
}

// stopRecord stops the watch and publishes the record of the controller
// that now serves the package-level functions, or c's last one.
func (c *Controller) stopRecord() {
	c.rec.closed.Store(true)
	c.publish()
}

// fingerprint sums what the GC-end watch compares: GOMEMLIMIT and each
// open pool's limit and name.
func fingerprint() uint64 {
	h := uint64(debug.SetMemoryLimit(-1))
	for _, p := range limits.Pools() {
		h = h*31 + uint64(p.Limit()) + uint64(len(p.Name()))<<1
	}
	return h
}

// chain returns a func that calls f (when set) and then g.
func chain(f, g func()) func() {
	if f == nil {
		return g
	}
	return func() { f(); g() }
}
