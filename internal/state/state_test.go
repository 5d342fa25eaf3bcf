package state

import (
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEncodeParse(t *testing.T) {
	gml := int64(241591910)
	lim := int64(1 << 20)
	r := &Record{PID: 7, Seq: 3, Updated: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC), GoMemLimit: GoMemLimit{Bytes: &gml, Source: "cgroup v1", File: "/sys/fs/cgroup/memory/x/memory.limit_in_bytes",
		MemoryLimitBytes: 256 << 20, Ratio: 0.9, RefreshSeconds: 10, Reason: "why"},
		THP: THP{Policy: "disable", State: "disabled", System: "madvise"}, Trim: Trim{DelaySeconds: 2, Trims: 4, Skipped: 1},
		Pools: []Pool{{Name: "api", Mode: "enforce", LimitBytes: &lim}, {Name: "free", Mode: "observe"}}, Pressure: Pressure{Source: "none"}, CHeap: "glibc"}
	r.Trim.Origins.Pressure = Origin{Trims: 2, Skipped: 3, CPUSeconds: 0.25, ReleasedBytes: 5 << 20}
	r.Trim.SkippedBy = SkippedBy{MinRelease: 1, Cost: 2, Budget: 3, Running: 4}
	r.AutoBurst = AutoBurst{Bursts: 2, Marks: 5, FloorBytes: 20 << 20, GCEnds: 100}
	r.Pressure = Pressure{Source: "psi", Signals: 9, Acted: 2, LeftToKernel: 7}
	r.CHeaps = []CHeap{{Allocator: "glibc", Library: "libc.so.6", OwnsMalloc: true, Trimmed: true, RetainedBytes: -1}}
	swapped, swapMax := int64(300<<20), int64(1<<30)
	r.Swap = &Swap{VmSwapBytes: &swapped, CgroupVersion: 2, CurrentBytes: &swapped, MaxBytes: &swapMax, File: "/sys/fs/cgroup/x/memory.swap.current"}
	counts := make([]int64, PeakCounts)
	counts[0], counts[4], counts[PeakCounts-1] = 98, 1, 1
	r.Pools[0].Peaks.Set(counts)
	r.Pools[0].Refused, r.Pools[0].Undercharged = 1, 2
	assert.Equal(t, Peaks{Count: 100, P50Bytes: 64 << 10, P99Bytes: 1 << 20, MaxBytes: math.MaxInt64, Counts: counts}, r.Pools[0].Peaks)
	b, err := Encode(r)
	require.NoError(t, err)
	assert.Equal(t, Version, r.Version)
	got, err := Parse(b)
	require.NoError(t, err)
	assert.Equal(t, r, got)

	// Unknown keys, anywhere, are ignored: a newer library adds fields.
	s := strings.Replace(string(b), `"version":1,`, `"version":1,"future":{"x":[1,2]},`, 1)
	s = strings.Replace(s, `"trims":4,`, `"trims":4,"by_origin":{"pressure":2},`, 1)
	got, err = Parse([]byte(s))
	require.NoError(t, err)
	assert.Equal(t, r, got)
}

func TestEncodeTooLarge(t *testing.T) {
	_, err := Encode(&Record{GoMemLimit: GoMemLimit{Reason: strings.Repeat("x", MaxSize)}})
	require.Error(t, err)
}

// A record whose lists would not fit in MaxSize (64 pools of long names
// with full histograms) loses its last pools, counted, and still parses:
// the record is never lost for being long.
func TestEncodeFits(t *testing.T) {
	r := &Record{PID: 1, Seq: 1, Updated: time.Now()}
	counts := make([]int64, PeakCounts)
	for i := range counts {
		counts[i] = math.MaxInt64 / PeakCounts
	}
	for range MaxPools {
		p := Pool{Name: Cut(strings.Repeat("\x01", MaxString)), Mode: "enforce"}
		p.Peaks.Set(slices.Clone(counts))
		r.Pools = append(r.Pools, p)
	}
	for range MaxCHeaps {
		r.CHeaps = append(r.CHeaps, CHeap{Allocator: Cut(strings.Repeat("\x02", MaxString)), Library: Cut(strings.Repeat("\x03", MaxString))})
	}
	b, err := Encode(r)
	require.NoError(t, err)
	assert.LessOrEqual(t, len(b), MaxSize)
	got, err := Parse(b)
	require.NoError(t, err)
	assert.Positive(t, got.PoolsOmitted)
	assert.Equal(t, MaxPools, len(got.Pools)+got.PoolsOmitted)
}

func TestCut(t *testing.T) {
	assert.Equal(t, "short", Cut("short"))
	long := strings.Repeat("é", MaxString) // 2 bytes a rune
	c := Cut(long)
	assert.LessOrEqual(t, len(c), MaxString)
	assert.True(t, strings.HasSuffix(c, "..."))
	assert.True(t, utf8.ValidString(c), "cut at a rune boundary")
	assert.Equal(t, MaxString, len(Cut(strings.Repeat("a", 2*MaxString))))
}

// Every kind of bad record is rejected whole.
func TestParseRejects(t *testing.T) {
	pools := `[` + strings.Repeat(`{"name":"p","mode":"enforce","limit_bytes":1},`, MaxPools) + `{"name":"p"}]`
	heaps := `[` + strings.Repeat(`{"allocator":"glibc"},`, MaxCHeaps) + `{"allocator":"x"}]`
	// rec is a record with what Publish always writes, and rest.
	rec := func(rest string) string {
		return `{"version":1,"pid":1,"seq":1,"updated":"2026-12-01T10:00:00Z",` + rest + `}`
	}
	counts := func(c ...int) string {
		s := make([]string, PeakCounts)
		for i := range s {
			s[i] = "0"
			if i < len(c) {
				s[i] = strconv.Itoa(c[i])
			}
		}
		return "[" + strings.Join(s, ",") + "]"
	}
	for name, tc := range map[string]struct{ in, want string }{
		"empty":            {``, "record:"},
		"not an object":    {`[1]`, "record:"},
		"no version":       {`{"pid":1}`, `unknown record version "missing"`},
		"version 2":        {`{"version":2}`, `unknown record version "2"`},
		"version string":   {`{"version":"1"}`, `unknown record version "\"1\""`},
		"version huge":     {`{"version":` + strings.Repeat("9", 100) + `}`, `unknown record version "99999999999999999999..."`},
		"not published":    {`{"version":1}`, "pid 0, updated 0001-01-01T00:00:00Z: not a published record"},
		"no pid":           {`{"version":1,"updated":"2026-12-01T10:00:00Z"}`, "pid 0, updated 2026-12-01T10:00:00Z"},
		"negative seq":     {`{"version":1,"pid":1,"seq":-1,"updated":"2026-12-01T10:00:00Z"}`, "seq -1 is negative"},
		"wrong type bytes": {rec(`"gomemlimit":{"bytes":"lots"}`), "cannot unmarshal"},
		"wrong type trims": {rec(`"trim":{"trims":1.5}`), "cannot unmarshal"},
		"wrong type pools": {rec(`"pools":"api"`), "cannot unmarshal"},
		"wrong type time":  {`{"version":1,"updated":5}`, "record:"},
		"too many pools":   {rec(`"pools":` + pools), "65 pools, more than 64"},
		"negative bytes":   {rec(`"gomemlimit":{"bytes":-1}`), "gomemlimit.bytes -1 is negative"},
		"negative count":   {rec(`"trim":{"skipped":-5}`), "trim.skipped -5 is negative"},
		"negative limit":   {rec(`"pools":[{"limit_bytes":-2}]`), "pools[0].limit_bytes -2 is negative"},
		"huge duration":    {rec(`"trim":{"delay_seconds":1e300}`), "trim.delay_seconds 1e+300 is not a duration"},
		"ratio":            {rec(`"gomemlimit":{"ratio":7}`), "gomemlimit.ratio 7 is not in [0, 1]"},
		"trailing data":    {`{"version":1} {"version":1}`, "after top-level value"},
		"too large":        {`{"version":1,"x":"` + strings.Repeat("a", MaxSize) + `"}`, "more than 65536"},

		// The fields of issues 17-21.
		"origin negative":    {rec(`"trim":{"origins":{"spiral":{"released_bytes":-1}}}`), "trim.origins.spiral.released_bytes -1 is negative"},
		"origin cpu NaN":     {rec(`"trim":{"origins":{"pressure":{"cpu_seconds":-0.5}}}`), "trim.origins.pressure.cpu_seconds -0.5 is not a duration"},
		"origin wrong type":  {rec(`"trim":{"origins":{"by_name":[1]}}`), "cannot unmarshal"},
		"skip negative":      {rec(`"trim":{"skipped_by":{"budget":-3}}`), "trim.skipped_by.budget -3 is negative"},
		"skip wrong type":    {rec(`"trim":{"skipped_by":{"cost":"\u001b[2J"}}`), "cannot unmarshal"},
		"auto negative":      {rec(`"auto_burst":{"floor_bytes":-9}`), "auto_burst.floor_bytes -9 is negative"},
		"left negative":      {rec(`"pressure":{"left_to_kernel":-1}`), "pressure.left_to_kernel -1 is negative"},
		"unknown wrong type": {rec(`"gomemlimit":{"limit_unknown":"yes"}`), "cannot unmarshal"},
		"too many heaps":     {rec(`"c_heaps":` + heaps), "17 c_heaps, more than 16"},
		"heap retained":      {rec(`"c_heaps":[{"retained_bytes":-2}]`), "c_heaps[0].retained_bytes -2 is neither a size nor -1"},
		"heap wrong type":    {rec(`"c_heaps":[{"trimmed":1}]`), "cannot unmarshal"},
		"heaps not a list":   {rec(`"c_heaps":{"allocator":"glibc"}`), "cannot unmarshal"},
		"pool refused":       {rec(`"pools":[{"refused":-1}]`), "pools[0].refused -1 is negative"},
		"pool undercharged":  {rec(`"pools":[{"undercharged":-1}]`), "pools[0].undercharged -1 is negative"},
		"swap vm negative":   {rec(`"swap":{"vm_swap_bytes":-1}`), "swap.vm_swap_bytes -1 is negative"},
		"swap cur negative":  {rec(`"swap":{"cgroup_version":2,"current_bytes":-4096}`), "swap.current_bytes -4096 is negative"},
		"swap max negative":  {rec(`"swap":{"cgroup_version":2,"max_bytes":-1}`), "swap.max_bytes -1 is negative"},
		"swap cgroup v3":     {rec(`"swap":{"cgroup_version":3}`), "swap.cgroup_version 3 is not 0, 1 or 2"},
		"swap type":          {rec(`"swap":{"vm_swap_bytes":"1 kB"}`), "cannot unmarshal"},
		"peaks short":        {rec(`"pools":[{"peaks":{"count":1,"counts":[1]}}]`), "pools[0].peaks: 1 counts, want 22"},
		"peaks long":         {rec(`"pools":[{"peaks":{"count":1,"counts":[` + strings.Repeat("0,", 1000) + `1]}}]`), "pools[0].peaks: 1001 counts, want 22"},
		"peaks sum":          {rec(`"pools":[{"peaks":{"count":5,"p50_bytes":65536,"p99_bytes":65536,"max_bytes":65536,"counts":` + counts(1) + `}}]`), "counts sum to 1, not count 5"},
		"peaks overflow":     {rec(`"pools":[{"peaks":{"count":1,"counts":` + counts(math.MaxInt64, math.MaxInt64) + `}}]`), "counts[1] 9223372036854775807 is negative or overflows"},
		"peaks negative":     {rec(`"pools":[{"peaks":{"count":0,"counts":` + counts(-1, 1) + `}}]`), "no peaks recorded, but counts or quantiles given"},
		"peaks p99":          {rec(`"pools":[{"peaks":{"count":2,"p50_bytes":65536,"p99_bytes":1,"max_bytes":131072,"counts":` + counts(1, 1) + `}}]`), "p99_bytes 1 is not 131072"},
		"peaks none, p50":    {rec(`"pools":[{"peaks":{"count":0,"p50_bytes":5}}]`), "no peaks recorded"},
		"peaks huge count":   {rec(`"pools":[{"peaks":{"count":1e30}}]`), "cannot unmarshal"},

		// Hostile encodings.
		"deep nesting":     {rec(`"x":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000)), "exceeded max depth"},
		"deep in a string": {rec(`"c_heap":` + strings.Repeat("{", 30000)), "record:"},
		"raw NUL":          {rec(`"c_heap":"a` + "\x00" + `b"`), "invalid character"},
		"NUL outside":      {rec(`"c_heap":"a"` + "\x00"), "invalid character"},
		"duplicate pools":  {rec(`"pools":[],"pools":` + pools), "65 pools, more than 64"},
	} {
		t.Run(name, func(t *testing.T) {
			r, err := Parse([]byte(tc.in))
			require.Error(t, err)
			assert.Nil(t, r)
			assert.Contains(t, err.Error(), tc.want)
			assert.Less(t, len(err.Error()), 1000, "the error is short: %.200s", err)
			if strings.Contains(name, "version") && name != "no version" {
				assert.True(t, errors.Is(err, ErrVersion))
			}
		})
	}
}

// Strings are what the process wrote: invalid UTF-8 comes back as U+FFFD
// (encoding/json), \u0000 and escapes as the runes; the caller quotes them.
func TestParseStrings(t *testing.T) {
	in := `{"version":1,"pid":1,"seq":1,"updated":"2026-12-01T10:00:00Z","c_heap":"a` + "\xff\xfe" + `b","pools":[{"name":"\u0000\u001b[2J"}],` +
		`"c_heaps":[{"allocator":"\u009b","library":"` + "\xc3" + `"}]}`
	r, err := Parse([]byte(in))
	require.NoError(t, err)
	assert.Equal(t, "a\ufffd\ufffdb", r.CHeap)
	assert.Equal(t, "\x00\x1b[2J", r.Pools[0].Name)
	assert.Equal(t, "\u009b", r.CHeaps[0].Allocator)
	assert.Equal(t, "\ufffd", r.CHeaps[0].Library)
}
