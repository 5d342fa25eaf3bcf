package main

import (
	"fmt"
	"strconv"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/memctl/memctl/internal/state"
	"github.com/memctl/memctl/thp"
)

// statusReport is what "memctl status -json" prints (docs/command.md);
// pointers are null when the value is not available.
type statusReport struct {
	PID                int               `json:"pid"`
	THPSystem          *thpSystem        `json:"thp_system"`
	THPEnabled         *int64            `json:"thp_enabled"`
	AnonHugePagesBytes *int64            `json:"anon_huge_pages_bytes"`
	VmRSSBytes         *int64            `json:"vm_rss_bytes"`
	VmHWMBytes         *int64            `json:"vm_hwm_bytes"`
	Cgroup             *memCgroup        `json:"cgroup"`
	CgroupError        string            `json:"cgroup_error,omitempty"`
	Env                map[string]string `json:"env"`
	RssAnonBytes       *int64            `json:"rss_anon_bytes"`
	RssFileBytes       *int64            `json:"rss_file_bytes"`
	RssShmemBytes      *int64            `json:"rss_shmem_bytes"`
	VmSwapBytes        *int64            `json:"vm_swap_bytes"`
	PssBytes           *int64            `json:"pss_bytes"`
	SmapsRollup        smapsRollup       `json:"smaps_rollup"`
	EnvBase64          []string          `json:"env_base64,omitempty"` // NAME=value not valid UTF-8
	MemoryEvents       map[string]int64  `json:"memory_events,omitempty"`
	MemoryEventsNote   string            `json:"memory_events_note,omitempty"`
	Memctl             *memctlRecord     `json:"memctl"`
	Unknown            map[string]string `json:"unknown,omitempty"` // JSON key: reason

	envRaw   map[string]string // every variable shown, valid UTF-8 or not
	thpState *thp.State        // PR_GET_THP_DISABLE: memctl's own process only
}

// memctlRecord is the state record, after "reported_by" and "file".
type memctlRecord struct {
	ReportedBy string `json:"reported_by"`
	File       string `json:"file"`
	*state.Record
}

// thpSystem is thp.Settings in the JSON document; null for absent files.
type thpSystem struct {
	Enabled      string `json:"enabled"`
	PMDEnabled   string `json:"pmd_enabled"`
	Defrag       string `json:"defrag"`
	PMDSizeBytes *int64 `json:"pmd_size_bytes"`
	MaxPTEsNone  *int   `json:"max_ptes_none"`
}

// thpSystemOf returns the JSON document's view of s.
func thpSystemOf(s thp.Settings) *thpSystem {
	t := &thpSystem{Enabled: s.Enabled, PMDEnabled: s.PMDEnabled, Defrag: s.Defrag}
	if s.PMDSize > 0 {
		t.PMDSizeBytes = &s.PMDSize
	}
	if s.MaxPTEsNone >= 0 {
		t.MaxPTEsNone = &s.MaxPTEsNone
	}
	return t
}

// memCgroup is the process's memory cgroup in the JSON document.
type memCgroup struct {
	Version      int      `json:"version"`
	Path         string   `json:"path"`
	Dir          string   `json:"dir"`
	LimitBytes   *int64   `json:"limit_bytes"`
	LimitFile    *string  `json:"limit_file"`
	View         string   `json:"view"`                    // "process", "memctl" or "memctl-root"
	LimitUnknown bool     `json:"limit_unknown,omitempty"` // cgroupfs.Limit.TopNotRoot
	Swap         *memSwap `json:"swap"`                    // null when absent: SwapNote says so
	SwapNote     string   `json:"swap_note,omitempty"`
}

// memSwap is the cgroup's swap (cgroupfs.Swap) in the JSON document.
type memSwap struct {
	CurrentBytes   int64  `json:"current_bytes"`
	MaxBytes       *int64 `json:"max_bytes"` // null: no limit ("max")
	CurrentFile    string `json:"current_file"`
	MaxFile        string `json:"max_file"`
	MemoryPlusSwap bool   `json:"memory_plus_swap"` // v1 memsw
}

// smapsRollup is the "smaps_rollup" of the JSON document.
type smapsRollup struct {
	Read bool   `json:"read"`
	Why  string `json:"why"`
}

// escapeJSON returns the JSON text b with every unprintable rune but
// newlines written as a \u escape, so none reaches a terminal raw.
func escapeJSON(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == '\n' || strconv.IsPrint(r) {
			out = append(out, b[i:i+n]...)
		} else if r1, r2 := utf16.EncodeRune(r); r1 != utf8.RuneError {
			out = fmt.Appendf(out, `\u%04x\u%04x`, r1, r2)
		} else {
			out = fmt.Appendf(out, `\u%04x`, r)
		}
		i += n
	}
	return out
}

// seconds formats a count of seconds as a duration.
func seconds(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(time.Microsecond).String()
}
