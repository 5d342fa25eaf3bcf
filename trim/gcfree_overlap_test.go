package trim

import (
	"math"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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

// TestNoGCStepRestoresAnyBase: GOMEMLIMIT is restored exactly whatever it
// was: unset (math.MaxInt64), an odd byte count, a value just over the
// heap mapped.
func TestNoGCStepRestoresAnyBase(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	for _, base := range []int64{math.MaxInt64, 3<<30 + 12345, 1<<62 - 1} {
		debug.SetMemoryLimit(base)
		g := burst.Alloc(64 << 20)
		runtime.KeepAlive(g)
		g = nil
		runtime.GC()
		_, steps, why, _ := releaseNoGC()
		t.Logf("base %d: %d steps, %v", base, steps, why)
		assert.Equal(t, base, debug.SetMemoryLimit(-1), "restored exactly")
	}
}

// TestNoGCStepProgramWritesStand: a program that writes GOMEMLIMIT over
// and over while Go steps run (from several goroutines), and stops while
// they still run, finds its last value in place once they are over.
func TestNoGCStepProgramWritesStand(t *testing.T) {
	base := int64(3 << 30)
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(base))
	for round := range 5 {
		var last atomic.Int64
		stepsDone := make(chan struct{})
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
					g := burst.Alloc(16 << 20)
					runtime.KeepAlive(g)
					releaseNoGC()
				}
			}()
		}
		go func() { wg.Wait(); close(stepsDone) }()
		for v, end := base+int64(round)<<30, time.Now().Add(150*time.Millisecond); time.Now().Before(end); v += 4096 {
			debug.SetMemoryLimit(v)
			last.Store(v)
		}
		<-stepsDone
		assert.Equal(t, last.Load(), debug.SetMemoryLimit(-1), "round %d: the program's last write stands", round)
	}
}
