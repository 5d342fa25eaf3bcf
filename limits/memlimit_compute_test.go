package limits

import (
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgroupfs"
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
		ratio: 0.9, ratioFrom: "configured", headroom: true}
}

// account is a read of a cgroup's account that charges anon bytes.
func account(dir string, anon int64) chargeRead {
	return chargeRead{c: charge{anon: anon, reclaimable: 20 * mib, file: dir + "/memory.stat"}, ok: true}
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
			assert.True(t, r.probed)
			assert.Equal(t, []string{v1Limit}, r.files)
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
			assert.True(t, r.estimated)
			assert.Equal(t, 300*mib, r.outside)
			assert.Equal(t, 100*mib, r.goMapped)
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
			assert.Equal(t, 80*mib, r.outside)
			assert.Equal(t, 400*mib, r.goMapped)
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
			assert.False(t, r.estimated)
			assert.True(t, r.probed)
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
			assert.Equal(t, []string{appMax, podMax}, r.files)
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
		check:  func(t *testing.T, r planResult) { assert.False(t, r.probed) },
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
