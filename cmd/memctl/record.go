package main

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"strings"
	"time"

	"github.com/memctl/memctl/internal/safefs"
	"github.com/memctl/memctl/internal/state"
)

// readRecord reads the process's state record (safefs.Dir.ReadMemfd, then
// state.Parse). No record is not an error: st.Memctl stays nil.
func readRecord(proc *safefs.Dir, st *statusReport) error {
	path, b, err := proc.ReadMemfd(state.MemfdName, state.MaxSize)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	r, err := state.Parse(b)
	if err != nil {
		// Quoted: a parse error may hold bytes of the record.
		return fmt.Errorf("state record %s rejected: %s", safefs.Quote(path), safefs.Quote(err.Error()))
	}
	st.Memctl = &memctlRecord{ReportedBy: "process", File: path, Record: r}
	return nil
}

// q quotes a string of the record (safefs.Quote, cut to 200 bytes).
var q = safefs.Quote

// record writes the rows of the state record, labeled as reported by the process.
func (t table) record() {
	if r, ok := t.st.Unknown["memctl"]; ok {
		t.row("memctl", "unknown: "+r)
		return
	}
	m := t.st.Memctl
	if m == nil {
		t.row("memctl", "none: no memctl state record (the process does not use the memctl library, or one older than the record)")
		return
	}
	r := m.Record
	note := ""
	switch {
	case r.Off:
		note = ", memctl is off (MEMCTL=off)"
	case r.Closed:
		note = ", controller closed"
	}
	t.row("memctl", fmt.Sprintf("reported by the process (not checked): record %s, version %d, seq %d, updated %s%s",
		q(m.File), r.Version, r.Seq, r.Updated.Format(time.RFC3339), note))
	t.goMemLimit(r.GoMemLimit)
	t.row("  THP", fmt.Sprintf("policy %s, process %s, system %s", q(r.THP.Policy), q(r.THP.State), q(r.THP.System)))
	t.trims(r.Trim)
	a := r.AutoBurst
	t.row("  auto-burst", fmt.Sprintf("%d bursts detected at GC end, %d marked for a trim, %d settled as growth, %d collected outside one; floor %s; %d GC ends seen",
		a.Bursts, a.Marks, a.Settled, a.Drops, size(&a.FloorBytes), a.GCEnds))
	t.pools(r)
	pr := r.Pressure
	t.row("  pressure", fmt.Sprintf("%s; %d signals, %d acted on, %d left to the kernel (mostly page cache), %d cancels held; %d GC death spirals, %d GOMEMLIMIT lifts (lifted by %s now)",
		q(pr.Source), pr.Signals, pr.Acted, pr.LeftToKernel, pr.CancelsHeld, pr.Spirals, pr.Lifts, size(&pr.LiftedBytes)))
	if r.Swap != nil {
		t.row("  swap", recordSwap(r.Swap)+"; as of the record's update")
	}
	t.cHeaps(r)
}

func (t table) goMemLimit(g state.GoMemLimit) {
	lim := "none"
	if g.Bytes != nil {
		lim = size(g.Bytes)
	}
	src := "source " + q(g.Source)
	if g.File != "" {
		src += " " + q(g.File)
	}
	if g.MemoryLimitBytes > 0 {
		src += fmt.Sprintf(", %.2f of %s", g.Ratio, size(&g.MemoryLimitBytes))
	}
	if g.OutsideBytes > 0 {
		src += ", less " + size(&g.OutsideBytes) + " outside the Go runtime"
	}
	if g.ReclaimableBytes > 0 {
		src += "; " + size(&g.ReclaimableBytes) + " of page cache (files read or mapped: reclaimable, not taken off)"
	}
	if g.OperatorBytes != nil {
		src += "; the operator's GOMEMLIMIT " + size(g.OperatorBytes)
		if g.Overridden {
			src += ", above the hard limit: memctl's value in force until the limit rises above it"
		}
	}
	refresh := "no refresh"
	if g.RefreshSeconds > 0 {
		refresh = "re-read at GC end at most every " + seconds(g.RefreshSeconds)
	}
	t.row("  GOMEMLIMIT", lim+"; "+src+"; "+refresh)
	if g.LimitUnknown {
		t.row("  memory limit", "unknown to the library: none up to the top of its cgroup namespace, which is not the root; a limit may be set above it")
	}
	t.row("  GOMEMLIMIT reason", q(g.Reason))
}

func (t table) trims(tr state.Trim) {
	if tr.DelaySeconds <= 0 {
		t.row("  trims", "off")
	} else {
		t.row("  trims", fmt.Sprintf("%d run, %d skipped (below the threshold); Go step skipped %d, C step skipped %d; %s released (last %s); %s of CPU; delay %s",
			tr.Trims, tr.Skipped, tr.GoSkipped, tr.CSkipped, size(&tr.ReleasedBytes), size(&tr.LastReleasedBytes),
			seconds(tr.CPUSeconds), seconds(tr.DelaySeconds)))
		if tr.Deferred > 0 || tr.EarlyStarts > 0 {
			t.row("", fmt.Sprintf("%d deferred by the CPU limit, %d started early (CPU cgroup throttled)", tr.Deferred, tr.EarlyStarts))
		}
	}
	var origins []string
	for _, o := range []struct {
		name string
		o    state.Origin
	}{{"debounced", tr.Origins.Debounced}, {"pressure", tr.Origins.Pressure}, {"spiral", tr.Origins.Spiral}, {"by name", tr.Origins.ByName}} {
		origins = append(origins, fmt.Sprintf("%s %d run, %d skipped, %s released, %s of CPU",
			o.name, o.o.Trims, o.o.Skipped, size(&o.o.ReleasedBytes), seconds(o.o.CPUSeconds)))
	}
	t.row("  trims by origin", strings.Join(origins, "; "))
	sb := tr.SkippedBy
	t.row("  trims skipped by", fmt.Sprintf("min_release %d (too little to release), cost %d (less than the GC is worth), budget %d (2%% CPU budget), running %d (a trim was running)",
		sb.MinRelease, sb.Cost, sb.Budget, sb.Running))
}

func (t table) pools(r *state.Record) {
	label := "  pools"
	if len(r.Pools) == 0 {
		t.row(label, "none")
	}
	for _, p := range r.Pools {
		lim := "unlimited"
		if p.LimitBytes != nil {
			lim = size(p.LimitBytes)
		}
		t.row(label, fmt.Sprintf("%s %s, limit %s; used %s, peak %s, %d in flight; %d refused, %d observed, %d canceled",
			q(p.Name), q(p.Mode), lim, size(&p.UsedBytes), size(&p.PeakBytes), p.InFlight, p.Refused, p.Observed, p.Canceled))
		label = ""
		if pk := p.Peaks; pk.Count > 0 {
			t.row("", fmt.Sprintf("request peaks: %d, p50 %s, p99 %s, max %s", pk.Count, peakBound(pk.P50Bytes), peakBound(pk.P99Bytes), peakBound(pk.MaxBytes)))
		}
		if p.Undercharged > 0 {
			t.row("", fmt.Sprintf("undercharged: %d GC ends saw far more live heap than the requests were charged (their charges look too small)", p.Undercharged))
		}
	}
	if r.PoolsOmitted > 0 {
		t.row("", fmt.Sprintf("and %d more", r.PoolsOmitted))
	}
}

// recordSwap formats the swap of the record.
func recordSwap(w *state.Swap) string {
	v := "VmSwap " + size(w.VmSwapBytes)
	switch {
	case w.CgroupVersion == 0:
		return v + "; cgroup swap not read: " + q(w.Note)
	case w.MemoryPlusSwap:
		v += "; cgroup memory plus swap (v1 memsw) " + size(w.CurrentBytes)
	default:
		v += "; cgroup swap " + size(w.CurrentBytes)
	}
	if w.MaxBytes != nil {
		v += ", limit " + size(w.MaxBytes)
	} else {
		v += ", no limit"
	}
	return v + " (" + q(w.File) + ")"
}

func (t table) cHeaps(r *state.Record) {
	t.row("  C heap", q(r.CHeap))
	label := "  C heaps"
	for _, h := range r.CHeaps {
		what := "not trimmed"
		if h.Trimmed {
			what = "trimmed"
		}
		if h.OwnsMalloc {
			what = "owns malloc, " + what
		}
		retained := "unknown"
		if h.RetainedBytes >= 0 {
			retained = size(&h.RetainedBytes)
		}
		v := fmt.Sprintf("%s in %s, %s; %d releases, %d skipped, %s released; retained %s",
			q(h.Allocator), q(h.Library), what, h.Releases, h.Skipped, size(&h.ReleasedBytes), retained)
		if h.Note != "" {
			v += "; " + q(h.Note)
		}
		t.row(label, v)
		label = ""
	}
	if r.CHeapsOmitted > 0 {
		t.row("", fmt.Sprintf("and %d more", r.CHeapsOmitted))
	}
}

// peakBound formats the upper bound of a peak histogram's bucket.
func peakBound(b int64) string {
	if b == math.MaxInt64 {
		return "over 64 GiB"
	}
	return "<= " + size(&b)
}
