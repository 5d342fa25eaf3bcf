package main

import (
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/memctl/memctl/internal/logattr"
	"github.com/memctl/memctl/internal/safefs"
	"github.com/memctl/memctl/internal/state"
	"github.com/memctl/memctl/thp"
)

// table writes status's rows: the process's strings through safefs.Quote,
// a field not read as "unknown: " and the reason.
type table struct {
	tw *tabwriter.Writer
	st *statusReport
}

func (t table) row(k, v string) { fmt.Fprintf(t.tw, "%s\t%s\n", k, v) }

// why returns the row of the field key when it is unknown.
func (t table) why(key string) (string, bool) {
	r, ok := t.st.Unknown[key]
	return "unknown: " + r, ok
}

// whyOr returns the row of the field key when it is unknown, else v.
func (t table) whyOr(key, v string) string {
	if r, ok := t.why(key); ok {
		return r
	}
	return v
}

func (t table) bytes(k, key string, n *int64) { t.row(k, t.whyOr(key, logattr.Size(n))) }

// writeTable writes st as an aligned two-column table.
func writeTable(w io.Writer, st *statusReport) {
	t := table{tabwriter.NewWriter(w, 0, 8, 2, ' ', 0), st}
	t.row("pid", strconv.Itoa(st.PID))
	t.thpSystem()
	t.thpEnabled()
	t.memory()
	t.cgroup()
	t.env()
	t.record()
	t.tw.Flush()
}

func (t table) thpSystem() {
	s := t.st.THPSystem
	if s == nil {
		t.row("THP system", t.whyOr("thp_system", "unavailable (kernel without THP)"))
		return
	}
	mode := s.Enabled
	if s.PMDEnabled != "" && s.PMDSizeBytes != nil {
		mode += fmt.Sprintf(" (hugepages-%dkB: %s)", *s.PMDSizeBytes/1024, s.PMDEnabled)
	}
	t.row("THP system", mode)
	t.row("THP defrag", s.Defrag)
	ptes := "absent"
	if s.MaxPTEsNone != nil {
		ptes = strconv.Itoa(*s.MaxPTEsNone)
	}
	t.row("khugepaged/max_ptes_none", ptes)
}

func (t table) thpEnabled() {
	st := t.st
	r, bad := t.why("thp_enabled")
	switch {
	case bad:
	case st.THPEnabled == nil && st.VmRSSBytes == nil:
		r = "unknown"
	case st.THPEnabled == nil:
		r = "unknown (before Linux 5.0)"
	case *st.THPEnabled == 0:
		r = "0 (disabled for the process: prctl PR_SET_THP_DISABLE)"
	case *st.THPEnabled != 1:
		r = strconv.FormatInt(*st.THPEnabled, 10)
	case st.thpState != nil && *st.thpState == thp.StateEnabled:
		r = "1 (enabled: follows the system mode)"
	case st.thpState != nil && *st.thpState == thp.StateDisabledExceptAdvised:
		r = "1 (disabled except advised: prctl PR_THP_DISABLE_EXCEPT_ADVISED)"
	default:
		// The kernel writes 1 for a clear flag and for "disabled except
		// advised" (Linux 6.18) alike.
		r = "1 (enabled, or disabled except advised: /proc cannot tell them apart)"
	}
	t.row("THP_enabled", r)
}

func (t table) memory() {
	st := t.st
	if _, rssBad := t.why("vm_rss_bytes"); st.VmRSSBytes == nil && !rssBad {
		t.row("memory", "none (a kernel thread or a zombie)")
	}
	t.bytes("VmRSS", "vm_rss_bytes", st.VmRSSBytes)
	t.bytes("VmHWM", "vm_hwm_bytes", st.VmHWMBytes)
	if st.VmRSSBytes != nil {
		t.bytes("RssAnon", "rss_anon_bytes", st.RssAnonBytes)
		t.bytes("RssFile", "rss_file_bytes", st.RssFileBytes)
		t.bytes("RssShmem", "rss_shmem_bytes", st.RssShmemBytes)
		t.bytes("VmSwap", "vm_swap_bytes", st.VmSwapBytes)
	}
	t.row("smaps_rollup", st.SmapsRollup.Why)
	if st.SmapsRollup.Read {
		t.bytes("Pss", "pss_bytes", st.PssBytes)
		t.bytes("AnonHugePages", "anon_huge_pages_bytes", st.AnonHugePagesBytes)
	} else if st.VmRSSBytes != nil {
		t.row("Pss, AnonHugePages", "not read (smaps_rollup)")
	}
}

func (t table) cgroup() {
	c := t.st.Cgroup
	if c == nil {
		t.row("cgroup", t.whyOr("cgroup", "none: "+t.st.CgroupError))
		t.memoryEvents()
		return
	}
	v := fmt.Sprintf("v%d %s", c.Version, safefs.Quote(c.Path))
	switch c.View {
	case "memctl":
		v += " (read in memctl's mount namespace: the process's own mounts no hierarchy with its memory controller)"
	case "memctl-root":
		v += " (read from memctl's root: the process is chrooted in memctl's mount namespace and its root shows no cgroup mount)"
	}
	t.row("cgroup", v)
	switch {
	case c.LimitUnknown:
		t.row("memory limit", "unknown: none up to the top of this cgroup namespace, which is not the root; a limit may be set above it "+
			"(give the process MEMCTL_MEMORY_LIMIT from the downward API, or use memctl's SystemFallback)")
	case c.LimitBytes == nil:
		t.row("memory limit", "none")
	default:
		t.row("memory limit", logattr.Size(c.LimitBytes)+" from "+safefs.Quote(*c.LimitFile))
	}
	if r, ok := t.why("swap"); ok {
		t.row("cgroup swap", r)
	} else if sw := c.Swap; sw != nil {
		what := "in swap"
		if sw.MemoryPlusSwap {
			what = "memory plus swap (v1 memsw)"
		}
		lim := "no limit"
		if sw.MaxBytes != nil {
			lim = "limit " + logattr.Size(sw.MaxBytes)
		}
		t.row("cgroup swap", fmt.Sprintf("%s %s from %s; %s from %s", logattr.Size(&sw.CurrentBytes), what, safefs.Quote(sw.CurrentFile), lim, safefs.Quote(sw.MaxFile)))
	} else if c.SwapNote != "" {
		t.row("cgroup swap", c.SwapNote)
	}
	t.memoryEvents()
}

func (t table) memoryEvents() {
	st := t.st
	if r, ok := t.why("memory_events"); ok {
		t.row("memory.events", r)
	} else if st.MemoryEventsNote != "" {
		t.row("memory.events", "absent: "+st.MemoryEventsNote)
	}
	label := "memory.events"
	for _, k := range slices.Sorted(maps.Keys(st.MemoryEvents)) {
		t.row(label, safefs.Quote(k)+" "+strconv.FormatInt(st.MemoryEvents[k], 10))
		label = ""
	}
}

func (t table) env() {
	keys := slices.Sorted(maps.Keys(t.st.envRaw))
	label := "env"
	for _, k := range keys {
		t.row(label, safefs.Quote(k+"="+t.st.envRaw[k]))
		label = ""
	}
	if r, ok := t.why("env"); ok {
		t.row(label, r)
	} else if len(keys) == 0 {
		t.row(label, "none of GOMEMLIMIT, GOGC, GODEBUG, AUTOMEMLIMIT, MEMCTL*, MALLOC_*, MIMALLOC_*, GLIBC_TUNABLES")
	}
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
		a.Bursts, a.Marks, a.Settled, a.Drops, logattr.Size(&a.FloorBytes), a.GCEnds))
	t.pools(r)
	pr := r.Pressure
	t.row("  pressure", fmt.Sprintf("%s; %d signals, %d acted on, %d left to the kernel (mostly page cache), %d cancels held; %d GC death spirals, %d GOMEMLIMIT lifts (lifted by %s now)",
		q(pr.Source), pr.Signals, pr.Acted, pr.LeftToKernel, pr.CancelsHeld, pr.Spirals, pr.Lifts, logattr.Size(&pr.LiftedBytes)))
	if r.Swap != nil {
		t.row("  swap", recordSwap(r.Swap)+"; as of the record's update")
	}
	t.cHeaps(r)
}

func (t table) goMemLimit(g state.GoMemLimit) {
	lim := "none"
	if g.Bytes != nil {
		lim = logattr.Size(g.Bytes)
	}
	src := "source " + q(g.Source)
	if g.File != "" {
		src += " " + q(g.File)
	}
	if g.MemoryLimitBytes > 0 {
		src += fmt.Sprintf(", %.2f of %s", g.Ratio, logattr.Size(&g.MemoryLimitBytes))
	}
	if g.OutsideBytes > 0 {
		src += ", less " + logattr.Size(&g.OutsideBytes) + " outside the Go runtime"
	}
	if g.ReclaimableBytes > 0 {
		src += "; " + logattr.Size(&g.ReclaimableBytes) + " of page cache (files read or mapped: reclaimable, not taken off)"
	}
	if g.OperatorBytes != nil {
		src += "; the operator's GOMEMLIMIT " + logattr.Size(g.OperatorBytes)
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
			tr.Trims, tr.Skipped, tr.GoSkipped, tr.CSkipped, logattr.Size(&tr.ReleasedBytes), logattr.Size(&tr.LastReleasedBytes),
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
			o.name, o.o.Trims, o.o.Skipped, logattr.Size(&o.o.ReleasedBytes), seconds(o.o.CPUSeconds)))
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
			lim = logattr.Size(p.LimitBytes)
		}
		t.row(label, fmt.Sprintf("%s %s, limit %s; used %s, peak %s, %d in flight; %d refused, %d observed, %d canceled",
			q(p.Name), q(p.Mode), lim, logattr.Size(&p.UsedBytes), logattr.Size(&p.PeakBytes), p.InFlight, p.Refused, p.Observed, p.Canceled))
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
	v := "VmSwap " + logattr.Size(w.VmSwapBytes)
	switch {
	case w.CgroupVersion == 0:
		return v + "; cgroup swap not read: " + q(w.Note)
	case w.MemoryPlusSwap:
		v += "; cgroup memory plus swap (v1 memsw) " + logattr.Size(w.CurrentBytes)
	default:
		v += "; cgroup swap " + logattr.Size(w.CurrentBytes)
	}
	if w.MaxBytes != nil {
		v += ", limit " + logattr.Size(w.MaxBytes)
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
			retained = logattr.Size(&h.RetainedBytes)
		}
		v := fmt.Sprintf("%s in %s, %s; %d releases, %d skipped, %s released; retained %s",
			q(h.Allocator), q(h.Library), what, h.Releases, h.Skipped, logattr.Size(&h.ReleasedBytes), retained)
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
	return "<= " + logattr.Size(&b)
}
