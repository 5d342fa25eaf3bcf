package limits

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestHeapPressure: the pool's heap-pressure decision at a GC end, each
// rule at its own threshold (just below, at, just above): the live heap
// against ratio of GOMEMLIMIT (strictly above is pressure), a GOMEMLIMIT
// set or not (≤ 0 and math.MaxInt64 are not), a threshold that rounds down
// to 0, a derived pool's limit against half of GOMEMLIMIT, and the cancel
// under pressure with CancelLargest.
func TestHeapPressure(t *testing.T) {
	// base is a pool with HeapPressure 0.75 of a 400-byte GOMEMLIMIT
	// (threshold 300), a fixed limit, without CancelLargest.
	base := heapInputs{live: 100, gomemlimit: 400, ratio: 0.75, limit: 1000}
	with := func(f func(*heapInputs)) heapInputs {
		in := base
		f(&in)
		return in
	}
	const maxI = math.MaxInt64
	for _, tc := range []struct {
		name string
		in   heapInputs
		want heapDecision
	}{
		{"live well below the threshold", base, heapDecision{threshold: 300}},
		{"live just below the threshold", with(func(in *heapInputs) { in.live = 299 }), heapDecision{threshold: 300}},
		{"live at the threshold: not over", with(func(in *heapInputs) { in.live = 300 }), heapDecision{threshold: 300}},
		{"live just above the threshold", with(func(in *heapInputs) { in.live = 301 }), heapDecision{threshold: 300, over: true}},
		{"live 0", with(func(in *heapInputs) { in.live = 0 }), heapDecision{threshold: 300}},
		{"default ratio 0.9", with(func(in *heapInputs) { in.ratio, in.gomemlimit, in.live = defaultHeapPressure, 1000, 901 }),
			heapDecision{threshold: 900, over: true}},
		{"ratio 1: threshold is GOMEMLIMIT, at it", with(func(in *heapInputs) { in.ratio, in.live = 1, 400 }), heapDecision{threshold: 400}},
		{"ratio 1: just above GOMEMLIMIT", with(func(in *heapInputs) { in.ratio, in.live = 1, 401 }), heapDecision{threshold: 400, over: true}},

		// GOMEMLIMIT not set: no threshold, no pressure, whatever the heap.
		{"GOMEMLIMIT math.MaxInt64: not set", with(func(in *heapInputs) { in.gomemlimit, in.live = maxI, maxI }), heapDecision{}},
		{"GOMEMLIMIT 0: not set", with(func(in *heapInputs) { in.gomemlimit, in.live = 0, 301 }), heapDecision{}},
		{"GOMEMLIMIT -1: not set", with(func(in *heapInputs) { in.gomemlimit, in.live = -1, 301 }), heapDecision{}},
		{"GOMEMLIMIT just below math.MaxInt64: set", with(func(in *heapInputs) { in.gomemlimit, in.ratio, in.live = maxI-1, 1, maxI }),
			heapDecision{threshold: maxI - 1, over: true}},
		{"GOMEMLIMIT just below math.MaxInt64, live at it", with(func(in *heapInputs) { in.gomemlimit, in.ratio, in.live = maxI-1, 1, maxI-1 }),
			heapDecision{threshold: maxI - 1}},

		// A threshold that rounds down to 0 is none: 0.75 of 1 byte is 0,
		// of 2 bytes 1.
		{"threshold rounds to 0: no pressure", with(func(in *heapInputs) { in.gomemlimit, in.live = 1, maxI }), heapDecision{}},
		{"threshold 1, live at it", with(func(in *heapInputs) { in.gomemlimit, in.live = 2, 1 }), heapDecision{threshold: 1}},
		{"threshold 1, live just above", with(func(in *heapInputs) { in.gomemlimit, in.live = 2, 2 }), heapDecision{threshold: 1, over: true}},

		// A derived pool follows GOMEMLIMIT when its limit is not half of
		// it (200 bytes here).
		{"derived, limit just below half of GOMEMLIMIT", with(func(in *heapInputs) { in.derived, in.limit = true, 199 }),
			heapDecision{threshold: 300, follow: true}},
		{"derived, limit at half of GOMEMLIMIT", with(func(in *heapInputs) { in.derived, in.limit = true, 200 }), heapDecision{threshold: 300}},
		{"derived, limit just above half of GOMEMLIMIT", with(func(in *heapInputs) { in.derived, in.limit = true, 201 }),
			heapDecision{threshold: 300, follow: true}},
		{"not derived, limit not half: no follow", with(func(in *heapInputs) { in.limit = 199 }), heapDecision{threshold: 300}},
		{"derived, GOMEMLIMIT not set: no follow", with(func(in *heapInputs) { in.derived, in.gomemlimit, in.limit = true, maxI, 1 }),
			heapDecision{}},
		{"derived, GOMEMLIMIT 0: no follow", with(func(in *heapInputs) { in.derived, in.gomemlimit, in.limit = true, 0, 1 }), heapDecision{}},
		{"derived under pressure: follows and is over", with(func(in *heapInputs) { in.derived, in.limit, in.live = true, 1, 301 }),
			heapDecision{threshold: 300, over: true, follow: true}},
		{"derived, GOMEMLIMIT 1: half rounds to 0, limit 1 follows", with(func(in *heapInputs) { in.derived, in.gomemlimit, in.limit = true, 1, 1 }),
			heapDecision{follow: true}},

		// CancelLargest cancels under pressure only.
		{"CancelLargest, live at the threshold: no cancel", with(func(in *heapInputs) { in.cancel, in.live = true, 300 }), heapDecision{threshold: 300}},
		{"CancelLargest, live just above the threshold", with(func(in *heapInputs) { in.cancel, in.live = true, 301 }),
			heapDecision{threshold: 300, over: true, cancel: true}},
		{"CancelLargest, GOMEMLIMIT not set: no cancel", with(func(in *heapInputs) { in.cancel, in.gomemlimit, in.live = true, maxI, maxI }),
			heapDecision{}},
		{"no CancelLargest under pressure: no cancel", with(func(in *heapInputs) { in.live = maxI }), heapDecision{threshold: 300, over: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, heapPressure(tc.in), "%+v", tc.in)
		})
	}
}

// TestHeapStale: a pool under heap pressure runs a GC cycle itself once
// its last reading is heapRefreshInterval old, not before.
func TestHeapStale(t *testing.T) {
	const now = int64(1_700_000_000_000_000_000)
	iv := int64(heapRefreshInterval)
	for _, tc := range []struct {
		name      string
		now, last int64
		want      bool
	}{
		{"read just now", now, now, false},
		{"just below the interval", now, now - iv + 1, false},
		{"at the interval", now, now - iv, true},
		{"just above the interval", now, now - iv - 1, true},
		{"never read (0)", now, 0, true},
		{"a reading after now (the clock stepped back)", now, now + iv, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, heapStale(tc.now, tc.last))
		})
	}
}

// TestCancelMin: the CancelShare of the live heap an account must hold,
// rounded down, at least 1 byte.
func TestCancelMin(t *testing.T) {
	for _, tc := range []struct {
		name  string
		live  int64
		share float64
		want  int64
	}{
		{"the default share", 100 * mib, defaultCancelShare, 5 * mib},
		{"share 1: all of it", 100, 1, 100},
		{"product just below 1: at least 1", 19, 0.05, 1}, // 0.95
		{"product 1", 20, 0.05, 1},
		{"product just above 1", 21, 0.05, 1},               // 1.05
		{"product just below 2: rounded down", 39, 0.05, 1}, // 1.95
		{"product 2", 40, 0.05, 2},
		{"live 0: at least 1", 0, 0.05, 1},
		{"math.MaxInt64 live, share 0.5", math.MaxInt64, 0.5, 1 << 62},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, cancelMin(tc.live, tc.share))
		})
	}
}
