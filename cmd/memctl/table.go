package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"text/tabwriter"

	"github.com/memctl/memctl/internal/safefs"
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

func (t table) bytes(k, key string, n *int64) { t.row(k, t.whyOr(key, size(n))) }

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
		t.row("memory limit", size(c.LimitBytes)+" from "+safefs.Quote(*c.LimitFile))
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
			lim = "limit " + size(sw.MaxBytes)
		}
		t.row("cgroup swap", fmt.Sprintf("%s %s from %s; %s from %s", size(&sw.CurrentBytes), what, safefs.Quote(sw.CurrentFile), lim, safefs.Quote(sw.MaxFile)))
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
