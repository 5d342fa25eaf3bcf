package trim

import (
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/burst"
)

// TestLiftDuringHeldTrims: Go steps without a GC from many goroutines
// (AfterBurst on two Trimmers sharing one hold, as the facade
// passes MemLimiter.Hold) while the hold's owner raises GOMEMLIMIT again
// and again (a death-spiral lift): once they are over, GOMEMLIMIT is
// exactly the owner's last value.
func TestLiftDuringHeldTrims(t *testing.T) {
	base := int64(3 << 30)
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(base))
	var mu sync.Mutex
	hold := func(fn func()) { mu.Lock(); defer mu.Unlock(); fn() }
	var trs []*Trimmer
	for range 2 {
		// A GC over cheapGC (not forced for a collected burst) whose CPU
		// charge is its least (no clock), so that trims come often.
		cfg := testConfig{Config: Config{Delay: time.Millisecond}, hooks: hooks{hold: hold,
			scan: func() int64 { return 16 << 20 }, cpuClock: func() time.Duration { return 0 }}}
		tr, err := newT(cfg)
		require.NoError(t, err)
		trs = append(trs, tr)
	}
	// Bursts and lifts go on until the Go step without a GC has run a few
	// times (its premise; how soon depends on the machine's load), for at
	// most 20 s.
	noGC := func() (n int64) {
		for _, tr := range trs {
			n += tr.Stats().NoGC
		}
		return n
	}
	var stop atomic.Bool
	deadline := time.Now().Add(20 * time.Second)
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr := trs[i%2]
			for !stop.Load() {
				done := tr.Begin()
				g := burst.Alloc(32 << 20) // well over MinRelease once collected
				runtime.KeepAlive(g)
				g = nil
				done()
				tr.AfterBurst()
				if i%3 == 0 {
					runtime.GC() // the burst collected: the step needs no GC
				}
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	var last int64
	for j := 0; noGC() < 2 && time.Now().Before(deadline); j++ {
		hold(func() {
			last = base + int64(j%8)<<26
			debug.SetMemoryLimit(last)
		})
		time.Sleep(time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	for _, tr := range trs {
		require.NoError(t, tr.Close())
		s := tr.Stats()
		t.Logf("trims %d, without a GC %d, skipped %d %d", s.Trims, s.NoGC, s.Skipped, s.SkippedCost)
	}
	assert.Equal(t, last, debug.SetMemoryLimit(-1), "the owner's last value stands")
	if noGC() == 0 {
		// Every decision found too little collected heap free to return
		// without a GC (the skips above): the machine's load kept the
		// premise from holding, and the restore was not exercised.
		t.Skip("no Go step without a GC ran in 20 s: nothing to check the restore against")
	}
}
