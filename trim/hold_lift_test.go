package trim

import (
	"runtime"
	"runtime/debug"
	"sync"
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
		cfg := Config{HoldMemoryLimit: hold, Delay: time.Millisecond}
		cfg.scan = func() int64 { return 1 << 30 } // a GC of about 2 s: not cheap
		tr, err := New(cfg)
		require.NoError(t, err)
		trs = append(trs, tr)
	}
	var wg sync.WaitGroup
	end := time.Now().Add(400 * time.Millisecond)
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr := trs[i%2]
			for time.Now().Before(end) {
				done := tr.Begin()
				g := burst.Alloc(8 << 20)
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
	for j := 0; time.Now().Before(end.Add(-50 * time.Millisecond)); j++ {
		hold(func() {
			last = base + int64(j%8)<<26
			debug.SetMemoryLimit(last)
		})
		time.Sleep(time.Millisecond)
	}
	wg.Wait()
	var noGC int64
	for _, tr := range trs {
		require.NoError(t, tr.Close())
		noGC += tr.Stats().NoGC
		t.Logf("trims %d, without a GC %d", tr.Stats().Trims, tr.Stats().NoGC)
	}
	assert.Equal(t, last, debug.SetMemoryLimit(-1), "the owner's last value stands")
	assert.Positive(t, noGC, "the Go step without a GC ran")
}
