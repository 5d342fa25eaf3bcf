package memctl

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHistoryParseStatm(t *testing.T) {
	page := int64(os.Getpagesize())
	for _, tc := range []struct {
		in   string
		want int64
	}{
		{"2000 512 100 1 0 300 0\n", 512 * page},
		{"2000 0 0 0 0 0 0", 0},
		{"", -1},
		{"2000", -1},
		{"2000  5", -1},
		{"2000 -5 0", -1},
		{"2000 5x 0", -1},
		{"2000 99999999999999999999 0", -1},
	} {
		assert.Equal(t, tc.want, parseStatm([]byte(tc.in)), "%q", tc.in)
	}
}

func TestHistoryKeepsTheLastMinutes(t *testing.T) {
	var r historyRing
	defer r.Close()
	t0 := time.Now()
	// A GC end every 10 ms for 10 s: one entry per 250 ms.
	for i := range 1000 {
		r.GCEnd(t0.Add(time.Duration(i)*10*time.Millisecond), int64(i), 1<<30)
	}
	r.Mark(t0.Add(10*time.Second), kindTrim, 1<<30)
	e := r.Entries()
	require.Len(t, e, 41)
	assert.Equal(t, kindTrim, e[40].Kind)
	assert.Equal(t, int64(999), e[40].Live, "a mark carries the last GC end's live heap")
	assert.Positive(t, e[0].RSS, "RSS read from /proc/self/statm")
	// Past historySize entries the oldest go.
	for i := range historySize + 10 {
		r.Mark(t0.Add(time.Minute+time.Duration(i)), kindLimit, int64(i))
	}
	e = r.Entries()
	require.Len(t, e, historySize)
	assert.Equal(t, int64(10), e[0].GoMemLimit)
	assert.Equal(t, int64(historySize+9), e[historySize-1].GoMemLimit)
}

func TestHistoryGCEndAllocatesNothing(t *testing.T) {
	var r historyRing
	defer r.Close()
	t0 := time.Now()
	i := 0
	assert.Zero(t, testing.AllocsPerRun(1000, func() {
		i++
		r.GCEnd(t0.Add(time.Duration(i)*time.Second), 1, 2) // an RSS read every call
	}))
}

// BenchmarkGCEnd is the cost a GC end pays for the history: most GC ends
// of a busy process come within historyGap of the last entry.
func BenchmarkHistoryGCEnd(b *testing.B) {
	for _, gap := range []time.Duration{time.Millisecond, time.Second} {
		b.Run(gap.String(), func(b *testing.B) {
			var r historyRing
			defer r.Close()
			t0 := time.Now()
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				i++
				r.GCEnd(t0.Add(time.Duration(i)*gap), 1, 2)
			}
		})
	}
}
