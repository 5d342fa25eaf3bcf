package limits

import (
	"errors"
	"log/slog"
	"math"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/internal/chold"
)

// The cgroup files of TestCompute's made-up limits.
const (
	appDir  = "/sys/fs/cgroup/pod/app"
	podDir  = "/sys/fs/cgroup/pod"
	appMax  = appDir + "/memory.max"
	appHigh = appDir + "/memory.high"
	podMax  = podDir + "/memory.max"
	v1Limit = "/sys/fs/cgroup/memory/app/memory.limit_in_bytes"
)

// v2Found is a v2 probe's result with memory.max max and memory.high high
// (noLimit for none) in appDir.
func v2Found(max, high int64) found {
	f := found{max: max, high: high, source: SourceCgroupV2, cgSource: SourceCgroupV2, version: 2, dir: appDir,
		why: "from " + appMax}
	if max != noLimit {
		f.maxFile = appMax
	} else {
		f.why = "from " + appHigh + " (memory.high, the throttle limit; no memory.max is set)"
	}
	if high != noLimit {
		f.highFile = appHigh
	}
	return f
}

// computeIn is the input of a decision from f: the process holds 50 MiB,
// all of it the Go runtime's, ratio 0.9, no floor, the headroom on.
func computeIn(f found) planInputs {
	return planInputs{cur: math.MaxInt64, f: f, held: 50 * mib, goMapped: 50 * mib,
		limState: limState{ratio: 0.9, ratioFrom: "configured", headroom: true}}
}

// account is a read of a cgroup's account that charges anon bytes.
func account(dir string, anon int64) chargeRead {
	return chargeRead{c: charge{anon: anon, reclaimable: 20 * mib, file: dir + "/memory.stat"}}
}

func TestCompute(t *testing.T) {
	v1 := found{max: gib, maxFile: v1Limit, high: noLimit, source: SourceCgroupV1, cgSource: SourceCgroupV1,
		version: 1, dir: "/sys/fs/cgroup/memory/app", why: "from " + v1Limit}
	type row struct {
		name string
		in   func() planInputs
		// want is GoMemLimit (and the action's want); hardWant is the
		// action's, 0 for want.
		want, hardWant int64
		kind           int
		hard, hardMin  int64
		hardFile       string
		highDriven     bool
		err            error
		reason         []string // substrings of Reason
		warns          []string // the warnings' keys, in order
		check          func(t *testing.T, r planResult)
	}
	rows := []row{{
		name: "v1 hard limit, nothing outside",
		in:   func() planInputs { return computeIn(v1) },
		want: ratioOf(gib), kind: actSet, hard: gib, hardMin: gib, hardFile: v1Limit,
		reason: []string{"configured ratio 0.9 of the cgroup v1 limit from " + v1Limit},
		check: func(t *testing.T, r planResult) {
			assert.Zero(t, r.d.Outside)
			assert.NotEmpty(t, r.st.dir, "probed")
			assert.Equal(t, []string{v1Limit}, r.st.files)
		},
	}, {
		name: "charges taken off",
		in: func() planInputs {
			in := computeIn(v2Found(gib, noLimit))
			in.held, in.goMapped = 100*mib, 100*mib
			in.boundCharges = []chargeRead{account(appDir, 300*mib)}
			return in
		},
		want: ratioOf(gib) - 200*mib, kind: actSet, hard: gib, hardMin: gib, hardFile: appMax,
		reason: []string{"of the cgroup v2 limit from " + appMax, "minus 200.0 MiB charged to the cgroup"},
		check: func(t *testing.T, r planResult) {
			assert.Equal(t, 200*mib, r.d.Charged, "the account less what the Go runtime holds")
			assert.Equal(t, 200*mib, r.d.Outside)
			assert.Equal(t, 20*mib, r.d.Reclaimable)
		},
	}, {
		name: "outside estimate larger than the charges",
		in: func() planInputs {
			in := computeIn(v2Found(gib, noLimit))
			in.held, in.goMapped = 400*mib, 100*mib
			in.boundCharges = []chargeRead{account(appDir, 150*mib)}
			return in
		},
		want: ratioOf(gib) - 300*mib, kind: actSet, hard: gib, hardMin: gib, hardFile: appMax,
		reason: []string{"minus 300.0 MiB outside the Go runtime"},
		check: func(t *testing.T, r planResult) {
			assert.Zero(t, r.d.Charged)
			assert.Equal(t, 300*mib, r.st.outside, "estimated")
			assert.Equal(t, 100*mib, r.st.mappedThen)
		},
	}, {
		name: "outside estimate kept while the Go runtime maps more than is held",
		in: func() planInputs {
			in := computeIn(v2Found(gib, noLimit))
			in.held, in.goMapped, in.outside, in.mappedThen = 100*mib, 400*mib, 80*mib, 200*mib
			return in
		},
		want: ratioOf(gib) - 80*mib, kind: actSet, hard: gib, hardMin: gib, hardFile: appMax,
		reason: []string{"minus 80.0 MiB outside the Go runtime"},
		check: func(t *testing.T, r planResult) {
			assert.Equal(t, 80*mib, r.st.outside)
			assert.Equal(t, 400*mib, r.st.mappedThen)
		},
	}, {
		name: "raised to the floor",
		in: func() planInputs {
			in := computeIn(v2Found(100*mib, noLimit))
			in.held, in.floor = 90*mib, 64*mib // 40 MiB outside
			return in
		},
		want: 64 * mib, kind: actSet, hard: 100 * mib, hardMin: 100 * mib, hardFile: appMax,
		reason: []string{"minus 40.0 MiB outside the Go runtime", "raised to the floor 64.0 MiB: the GC will run often"},
		warns:  []string{"floor " + appMax + " 104857600"},
		check:  func(t *testing.T, r planResult) { assert.True(t, r.d.AtFloor) },
	}, {
		name: "raised to the limit itself under the floor",
		in: func() planInputs {
			in := computeIn(v2Found(100*mib, noLimit))
			in.held, in.goMapped, in.floor = 10*mib, 10*mib, defaultFloor*4
			return in
		},
		want: 100 * mib, kind: actSet, hard: 100 * mib, hardMin: 100 * mib, hardFile: appMax,
		reason: []string{"raised to the limit itself (under the floor 256.0 MiB)"},
		warns:  []string{"floor " + appMax + " 104857600"},
	}, {
		name: "memory.high alone",
		in: func() planInputs {
			in := computeIn(v2Found(noLimit, 512*mib))
			in.live = 10 * mib
			return in
		},
		want: ratioOf(512 * mib), hardWant: math.MaxInt64, kind: actSet, hard: noLimit, hardMin: noLimit,
		hardFile: appHigh, highDriven: true,
		reason: []string{"configured ratio 0.9 of the cgroup v2 limit from " + appHigh + " (memory.high, the throttle limit"},
		check: func(t *testing.T, r planResult) {
			assert.Equal(t, 512*mib, r.d.High)
			assert.Equal(t, 512*mib, r.d.MemoryLimit)
		},
	}, {
		name: "memory.high under memory.max, held at the live-heap floor",
		in: func() planInputs {
			in := computeIn(v2Found(gib, 16*mib))
			in.live = 100 * mib
			return in
		},
		want: 150 * mib, hardWant: ratioOf(gib), kind: actSet, hard: gib, hardMin: gib, hardFile: appMax, highDriven: true,
		reason: []string{"toward memory.high 16.0 MiB (" + appHigh, "held at 1.5 x the live heap of 100.0 MiB"},
		check: func(t *testing.T, r planResult) {
			assert.True(t, r.d.LiveFloor)
			assert.Equal(t, 16*mib, r.d.High)
			assert.Equal(t, gib, r.d.MemoryLimit, "the hard limit is still memory.max")
		},
	}, {
		name: "memory.high over memory.max is no target",
		in:   func() planInputs { return computeIn(v2Found(gib, 2*gib)) },
		want: ratioOf(gib), kind: actSet, hard: gib, hardMin: gib, hardFile: appMax,
		check: func(t *testing.T, r planResult) { assert.Zero(t, r.d.High) },
	}, {
		name: "lift",
		in: func() planInputs {
			in := computeIn(v2Found(gib, noLimit))
			in.lift = 50 * mib
			return in
		},
		want: ratioOf(gib) + 50*mib, kind: actSet, hard: gib, hardMin: gib, hardFile: appMax,
		reason: []string{"lifted by 50.0 MiB (death spiral)"},
	}, {
		name: "lift all the way up ends at the limit less what is outside",
		in: func() planInputs {
			in := computeIn(v2Found(gib, noLimit))
			in.held, in.lift = 150*mib, math.MaxInt64 // 100 MiB outside
			return in
		},
		want: gib - 100*mib, kind: actSet, hard: gib, hardMin: gib, hardFile: appMax,
		reason: []string{"minus 100.0 MiB outside the Go runtime", ", lifted by"},
	}, {
		name: "implausible memory.high with memory.max: ignored",
		in:   func() planInputs { return computeIn(v2Found(gib, 1)) },
		want: ratioOf(gib), kind: actSet, hard: gib, hardMin: gib, hardFile: appMax,
		warns: []string{"implausible " + appHigh + " 1"},
		check: func(t *testing.T, r planResult) {
			assert.False(t, r.warns[0].first)
			assert.ErrorIs(t, r.warns[0].err, ErrImplausibleLimit)
			assert.Zero(t, r.d.High)
		},
	}, {
		name: "implausible memory.high alone: left as it was",
		in: func() planInputs {
			in := computeIn(v2Found(noLimit, 0))
			in.first, in.cur = true, 300*mib
			return in
		},
		want: 300 * mib, kind: actNone, err: ErrImplausibleLimit,
		reason: []string{"GOMEMLIMIT left as it was: ", appHigh + " says 0 bytes"},
		warns:  []string{"implausible " + appHigh + " 0"},
		check: func(t *testing.T, r planResult) {
			assert.True(t, r.warns[0].first, "the first decision returns its error")
			assert.Zero(t, r.st.mappedThen, "not estimated")
			assert.NotEmpty(t, r.st.dir, "probed")
		},
	}, {
		name: "hard limit at what is held on the first decision: left as it was",
		in: func() planInputs {
			in := computeIn(v2Found(40*mib, noLimit))
			in.first = true
			return in
		},
		want: math.MaxInt64, kind: actNone, err: ErrImplausibleLimit,
		reason: []string{"GOMEMLIMIT left as it was: ", appMax + " says 41943040 bytes, but this process already holds 52428800 bytes"},
		warns:  []string{"implausible " + appMax + " 41943040"},
	}, {
		name: "hard limit lowered under what is held at run time: followed",
		in: func() planInputs {
			in := computeIn(v2Found(40*mib, noLimit))
			in.applied, in.limit, in.maxFile = ratioOf(512*mib), 512*mib, appMax
			return in
		},
		want: ratioOf(40 * mib), kind: actSet, hard: 40 * mib, hardMin: 40 * mib, hardFile: appMax,
		warns: []string{"under usage " + appMax},
	}, {
		name: "hard limit unchanged under what is held: followed without a warning",
		in: func() planInputs {
			in := computeIn(v2Found(40*mib, noLimit))
			in.applied, in.limit, in.maxFile = ratioOf(40*mib), 40*mib, appMax
			return in
		},
		want: ratioOf(40 * mib), kind: actSet, hard: 40 * mib, hardMin: 40 * mib, hardFile: appMax,
	}, {
		name: "the parent leaves less",
		in: func() planInputs {
			f := v2Found(gib, noLimit)
			f.bounds = []cgroupfs.Bound{{Bytes: gib, File: appMax}, {Bytes: 2 * gib, File: podMax}}
			in := computeIn(f)
			in.boundCharges = []chargeRead{account(appDir, 100*mib), account(podDir, 1500*mib)}
			return in
		},
		want: ratioOf(2*gib) - 1450*mib, kind: actSet, hard: 2 * gib, hardMin: gib, hardFile: podMax,
		reason: []string{"from " + podMax + " (with what its cgroup is charged, it leaves less than the tighter " + appMax + ")",
			"minus 1450.0 MiB charged to the cgroup"},
		warns: []string{"headroom " + podMax},
		check: func(t *testing.T, r planResult) {
			assert.Equal(t, 2*gib, r.d.MemoryLimit)
			assert.Equal(t, podMax, r.d.File)
			assert.Equal(t, []string{appMax, podMax}, r.st.files)
		},
	}, {
		name: "warnings in order: memory.high ignored, the account's read, the headroom",
		in: func() planInputs {
			in := computeIn(v2Found(gib, 0))
			cr := account(appDir, 800*mib)
			cr.warn = &planWarning{key: "charge " + appDir, err: errors.New("stat")}
			in.boundCharges = []chargeRead{cr}
			return in
		},
		want: ratioOf(gib) - 750*mib, kind: actSet, hard: gib, hardMin: gib, hardFile: appMax,
		warns: []string{"implausible " + appHigh + " 0", "charge " + appDir, "headroom " + appMax},
	}, {
		name: "probe error",
		in: func() planInputs {
			in := computeIn(found{})
			in.probeErr = errors.New("limits: memory limit: boom")
			return in
		},
		want: math.MaxInt64, kind: actNone, err: errors.New("limits: memory limit: boom"),
		reason: []string{"GOMEMLIMIT left as it was: limits: memory limit: boom"},
		warns:  []string{"limits: memory limit: boom"},
		check:  func(t *testing.T, r planResult) { assert.Empty(t, r.st.dir, "not probed") },
	}, {
		name: "no limit",
		in: func() planInputs {
			return computeIn(found{max: noLimit, high: noLimit, version: 2, why: "no cgroup memory limit: none"})
		},
		want: math.MaxInt64, kind: actRestore, hardMin: noLimit,
		reason: []string{"no cgroup memory limit: none; GOMEMLIMIT left as it was"},
	}}
	for _, tc := range rows {
		t.Run(tc.name, func(t *testing.T) {
			r := compute(tc.in())
			assert.Equal(t, tc.want, r.d.GoMemLimit, "GoMemLimit")
			assert.Equal(t, tc.kind, r.a.kind, "action")
			switch {
			case tc.err == nil:
				require.NoError(t, r.err)
			case errors.Is(tc.err, ErrImplausibleLimit):
				require.ErrorIs(t, r.err, ErrImplausibleLimit)
			default:
				require.EqualError(t, r.err, tc.err.Error())
			}
			if tc.kind == actSet {
				hardWant := tc.hardWant
				if hardWant == 0 {
					hardWant = tc.want
				}
				assert.Equal(t, tc.want, r.a.want, "action's want")
				assert.Equal(t, hardWant, r.a.hardWant, "hardWant")
				assert.Equal(t, tc.hard, r.a.hard, "hard")
				assert.Equal(t, tc.hardFile, r.a.hardFile, "hardFile")
				assert.Equal(t, tc.highDriven, r.a.highDriven, "highDriven")
			}
			assert.Equal(t, tc.hardMin, r.a.hardMin, "hardMin")
			for _, s := range tc.reason {
				assert.Contains(t, r.d.Reason, s)
			}
			var keys []string
			for _, w := range r.warns {
				keys = append(keys, w.key)
			}
			assert.Equal(t, tc.warns, keys, "the warnings' keys")
			if tc.check != nil {
				tc.check(t, r)
			}
		})
	}
}

// TestHeadroom: memory outside the Go runtime (a C heap) comes off the
// limit, never below the floor.
func TestHeadroom(t *testing.T) {
	keepMemoryLimit(t)
	var mu sync.Mutex
	rss, goMapped := int64(400<<20), int64(100<<20)
	cfg := cfgFor(fixedLimit(1, gib))
	cfg.deps.usage = func() (int64, int64, error) {
		mu.Lock()
		defer mu.Unlock()
		return rss, goMapped, nil
	}
	m, d, err := start(t, cfg)
	require.NoError(t, err)
	want := ninetyPct(gib) - 300<<20
	assert.Equal(t, want, d.GoMemLimit)
	assert.Equal(t, want, debug.SetMemoryLimit(-1))
	assert.Equal(t, int64(300<<20), d.Outside)
	assert.Contains(t, d.Reason, "minus 300.0 MiB outside the Go runtime")

	mu.Lock()
	rss = 110 << 20 // the C heap was freed and trimmed
	mu.Unlock()
	d, err = m.Refresh()
	require.NoError(t, err)
	assert.Equal(t, ninetyPct(gib)-10<<20, debug.SetMemoryLimit(-1), "GOMEMLIMIT follows the C heap down")

	mu.Lock()
	rss = 105 << 20 // moved by less than 1%: left alone, no log churn
	mu.Unlock()
	d, err = m.Refresh()
	require.NoError(t, err)
	assert.Equal(t, ninetyPct(gib)-10<<20, d.GoMemLimit)

	mu.Lock()
	rss = 1000 << 20 // almost all of the limit is C heap: the floor holds
	mu.Unlock()
	d, err = m.Refresh()
	require.NoError(t, err)
	assert.Equal(t, int64(defaultFloor), debug.SetMemoryLimit(-1))
	assert.True(t, d.AtFloor)

	// NoHeadroom: the ratio alone.
	cfg.NoHeadroom = true
	_, d, err = start(t, cfg)
	require.NoError(t, err)
	assert.Equal(t, ninetyPct(gib), d.GoMemLimit)
	assert.Zero(t, d.Outside)

	// No RSS (not Linux): no headroom, and the Go runtime's share is what
	// the sanity check compares with.
	cfg.NoHeadroom = false
	cfg.deps.usage = func() (int64, int64, error) { return 0, 100 << 20, errors.New("no /proc") }
	_, d, err = start(t, cfg)
	require.NoError(t, err)
	assert.Equal(t, ninetyPct(gib), d.GoMemLimit)
	cfg.deps.read = fixedLimit(1, 90<<20)
	_, _, err = start(t, cfg)
	require.ErrorIs(t, err, ErrImplausibleLimit)
}

func TestFloor(t *testing.T) {
	keepMemoryLimit(t)
	for _, tc := range []struct {
		limit, floor int64
		ratio        float64
		want         int64
		atFloor      bool
	}{
		{limit: gib, ratio: 0.01, want: defaultFloor, atFloor: true}, // a ratio under the floor
		{limit: gib, floor: 512 << 20, want: ninetyPct(gib)},
		{limit: gib, floor: 1000 << 20, want: 1000 << 20, atFloor: true},
		{limit: 100 << 20, floor: 2 * gib, want: 100 << 20, atFloor: true}, // never over the limit
		{limit: 40 << 20, want: 40 << 20, atFloor: true},
	} {
		rec := &recorder{}
		cfg := cfgFor(fixedLimit(2, tc.limit))
		cfg.Ratio, cfg.Floor, cfg.Logger = tc.ratio, tc.floor, slog.New(rec)
		_, d, err := start(t, cfg)
		require.NoError(t, err)
		assert.Equal(t, tc.want, debug.SetMemoryLimit(-1), "%+v", tc)
		assert.Equal(t, tc.atFloor, d.AtFloor, "%+v", tc)
		if tc.atFloor {
			assert.Equal(t, 1, rec.count(slog.LevelWarn), "one WARN that the GC will run often")
			assert.Contains(t, d.Reason, "the GC will run often")
		} else {
			assert.Empty(t, rec.levels())
		}
	}
}

// While a burst has the runtime map more than the kernel has backed yet
// (RSS below the runtime's mapped memory), the headroom for memory outside
// the Go runtime keeps its last estimate instead of dropping to 0, which
// raised GOMEMLIMIT in the middle of a burst (found by the new-user trial:
// 234835822 -> 241591910 in a 256 MiB cgroup).
func TestHeadroomKeptWhileRSSBelowMapped(t *testing.T) {
	keepMemoryLimit(t)
	rss, mapped := int64(40<<20), int64(32<<20) // 8 MiB outside
	cfg := cfgFor(fixedLimit(1, 256<<20))
	cfg.deps.usage = func() (int64, int64, error) { return rss, mapped, nil }
	m, d, err := start(t, cfg)
	require.NoError(t, err)
	base := ninetyPct(256 << 20)
	require.Equal(t, base-8<<20, d.GoMemLimit)

	rss, mapped = 120<<20, 150<<20 // a burst: mapped, not yet resident
	d, err = m.Refresh()
	require.NoError(t, err)
	assert.Equal(t, int64(8<<20), d.Outside, "the last estimate is kept")
	assert.Equal(t, base-8<<20, d.GoMemLimit)

	rss, mapped = 36<<20, 32<<20 // the C heap shrank to 4 MiB
	d, err = m.Refresh()
	require.NoError(t, err)
	assert.Equal(t, int64(4<<20), d.Outside, "a real reading replaces it")
}

// TestLiftHuge: a lift of math.MaxInt64 ("all the way") gives the cgroup
// limit, as a lift of 1 TiB does; want + lift wrapped negative, and
// GOMEMLIMIT was left at a value that was not the decision.
func TestLiftHuge(t *testing.T) {
	keepMemoryLimit(t)
	m, d, err := start(t, cfgFor(fixedLimit(1, gib)))
	require.NoError(t, err)
	base := d.GoMemLimit
	for _, extra := range []int64{math.MaxInt64, math.MaxInt64 - base + 1, 1 << 62} {
		_, to, ok := m.Lift(extra)
		require.True(t, ok, "%d", extra)
		assert.Equal(t, gib, to, "lift %d", extra)
		assert.Equal(t, gib, debug.SetMemoryLimit(-1), "lift %d", extra)
		assert.Equal(t, gib, m.Last().GoMemLimit, "lift %d", extra)
		_, to, ok = m.Lift(0)
		require.True(t, ok)
		assert.Equal(t, base, to)
	}
}

// TestHeadroomOverLimitWarnsOnce (attack on issue 18; it held before): a
// cgroup charged more outside the Go runtime than its whole limit, and more
// at each refresh: GOMEMLIMIT stays at the floor, and the headroom and
// floor WARNs are logged once each, not at every refresh.
func TestHeadroomOverLimitWarnsOnce(t *testing.T) {
	keepMemoryLimit(t)
	rec := &recorder{}
	cfg := cfgFor(func() (cgroupfs.Limit, error) {
		return cgroupfs.Limit{Version: 1, Cgroup: "/x", Dir: "/sys/fs/cgroup/memory/x", Bytes: 512 * mib, File: "/sys/fs/cgroup/memory/x/memory.limit_in_bytes"}, nil
	})
	var n int64
	cfg.deps.charge = func(int, string) (charge, error) {
		n++
		return charge{anon: 600*mib + n*10*mib, file: "/sys/fs/cgroup/memory/x/memory.stat"}, nil
	}
	cfg.Logger = slog.New(rec)
	m, d, err := start(t, cfg)
	require.NoError(t, err)
	assert.Equal(t, int64(defaultFloor), d.GoMemLimit)
	for range 10 {
		d, err = m.Refresh()
		require.NoError(t, err)
		assert.Equal(t, int64(defaultFloor), debug.SetMemoryLimit(-1), d.Reason)
		assert.True(t, d.AtFloor)
	}
	assert.Equal(t, 2, rec.count(slog.LevelWarn), "headroom and floor, once each: %s", rec.text())
	assert.Contains(t, rec.text(), "most of it")
	assert.Contains(t, rec.text(), "at the floor")
}

const heldC = 300 << 20

func init() {
	// headroom holds 300 MiB of C heap, sets GOMEMLIMIT with the default
	// configuration (refresh every 100 ms), frees and trims the C heap,
	// and allocates until a GC-end refresh has raised GOMEMLIMIT.
	children["headroom"] = func() {
		if err := chold.Hold(heldC); err != nil {
			childtest.Fail("%v", err)
		}
		m, d, err := NewMemLimiter(MemLimitConfig{Refresh: 100 * time.Millisecond})
		if err != nil {
			childtest.Fail("%v", err)
		}
		childtest.Say("HELD_GOMEMLIMIT", debug.SetMemoryLimit(-1))
		childtest.Say("HELD_OUTSIDE", d.Outside)
		childtest.Say("LIMIT", d.MemoryLimit)
		if err := chold.Release(); err != nil {
			childtest.Fail("%v", err)
		}
		start := time.Now()
		var sink []byte
		// The published decision, not GOMEMLIMIT: a refresh writes
		// GOMEMLIMIT, then publishes the decision it came from, so a
		// reader who sees the new GOMEMLIMIT first can read the old
		// decision's Outside.
		for i := 0; m.Last().GoMemLimit == d.GoMemLimit && time.Since(start) < 20*time.Second; i++ {
			sink = make([]byte, 1<<20) // garbage: GC cycles, and so refreshes
			if i%64 == 0 {
				time.Sleep(time.Millisecond)
			}
		}
		_ = sink
		last := m.Last()
		childtest.Say("FREED_GOMEMLIMIT", last.GoMemLimit)
		childtest.Say("FREED_OUTSIDE", last.Outside)
		childtest.Say("FOLLOWED_AFTER", time.Since(start))
	}
}

// TestHeadroomForCHeap: a cgo process holding 300 MiB of C heap in a 1 GiB
// cgroup gets GOMEMLIMIT at most 0.9 GiB − 300 MiB, and GOMEMLIMIT rises
// back at a GC-end refresh once the C heap is freed and trimmed.
func TestHeadroomForCHeap(t *testing.T) {
	if err := chold.Hold(0); errors.Is(err, errors.ErrUnsupported) {
		t.Skip(err)
	}
	_ = chold.Release()
	g := cgrouptest.New(t, gib)
	cmd := childtest.Command(t, "headroom", []string{"GOMEMLIMIT", "AUTOMEMLIMIT"})
	g.Wrap(cmd)
	r := childtest.Report(t, cmd)
	num := func(k string) int64 { return childtest.RequireInt(t, r, k) }
	require.Equal(t, gib, num("LIMIT"))
	held, freed := num("HELD_GOMEMLIMIT"), num("FREED_GOMEMLIMIT")
	// The estimate (RssAnon + RssShmem less what the Go runtime mapped)
	// errs low by the runtime's mapped pages never touched: a few MiB of
	// metadata and stacks, within the ratio's headroom.
	const untouched = 8 << 20
	assert.LessOrEqual(t, held, ninetyPct(gib)-heldC+untouched, "GOMEMLIMIT leaves room for the C heap")
	assert.GreaterOrEqual(t, num("HELD_OUTSIDE"), int64(heldC-untouched))
	assert.Greater(t, freed, held+250<<20, "GOMEMLIMIT follows the C heap down")
	assert.LessOrEqual(t, freed, ninetyPct(gib))
	assert.Less(t, num("FREED_OUTSIDE"), int64(32<<20))
	t.Logf("1 GiB cgroup: holding 300 MiB of C heap: GOMEMLIMIT %d (%.1f MiB, outside %.1f MiB); freed: %d (%.1f MiB, outside %.1f MiB) after %s",
		held, float64(held)/(1<<20), float64(num("HELD_OUTSIDE"))/(1<<20),
		freed, float64(freed)/(1<<20), float64(num("FREED_OUTSIDE"))/(1<<20), r["FOLLOWED_AFTER"])
}
