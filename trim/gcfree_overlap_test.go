package trim

import (
	"runtime"
	"runtime/debug"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/memctl/memctl/internal/burst"
)

// TestNoGCStepsOverlap: two Go steps without a GC at once (two Trimmers,
// one without the MemLimiter's hold: a program's own trim.New beside
// memctl.Start's) leave GOMEMLIMIT exactly as it was. Each took the other's
// lowered limit for a foreign write: the first stopped without restoring,
// the second restored the first's lowered limit as its base, and
// GOMEMLIMIT stayed lowered for good.
func TestNoGCStepsOverlap(t *testing.T) {
	base := int64(3 << 30)
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(base))
	for attempt := range 20 {
		g := burst.Alloc(128 << 20)
		runtime.KeepAlive(g)
		g = nil
		runtime.GC()
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				releaseNoGC()
			}()
		}
		close(start)
		wg.Wait()
		if !assert.Equal(t, base, debug.SetMemoryLimit(-1), "attempt %d: GOMEMLIMIT restored exactly", attempt) {
			return
		}
	}
}
