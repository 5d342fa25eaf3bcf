package burst

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/procfs"
)

func TestAllocSizes(t *testing.T) {
	assert.Nil(t, Alloc(-1))
	assert.Nil(t, Alloc(ObjectSize-1))
	objs := Alloc(3*ObjectSize + 5)
	require.Len(t, objs, 3)
	for _, o := range objs {
		assert.Len(t, o, ObjectSize)
		assert.Equal(t, byte(1), o[4096])
	}
}

// The pages are really resident: RSS grows by about the burst. The free
// heap is returned to the OS first, so that the burst cannot reuse pages
// an earlier one left resident (-count=2 read no growth).
func TestAllocIsResident(t *testing.T) {
	debug.FreeOSMemory()
	before, err := procfs.RSS(0)
	if err != nil {
		t.Skipf("needs /proc: %v", err)
	}
	objs := Alloc(64 << 20)
	after, err := procfs.RSS(0)
	require.NoError(t, err)
	assert.Greater(t, after-before, int64(56<<20), "RSS grew by %d bytes", after-before)
	runtime.KeepAlive(objs)
}

// Garbage allocates at most perSecond a second (one 10 ms step per tick,
// a tick no sooner than 10 ms after the last), allocates something, and
// returns once stop is closed.
func TestGarbageRate(t *testing.T) {
	const perSecond = 16 << 20
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	a0 := s[0].Value.Uint64()
	stop, done := make(chan struct{}), make(chan struct{})
	t0 := time.Now()
	go func() { Garbage(perSecond, stop); close(done) }()
	time.Sleep(200 * time.Millisecond)
	close(stop)
	<-done
	elapsed := time.Since(t0)
	metrics.Read(s)
	got := int64(s[0].Value.Uint64() - a0)
	step := int64(perSecond / 100)
	assert.Positive(t, got, "it allocated")
	// This test's own allocations are far under one step.
	assert.LessOrEqual(t, got, (int64(elapsed/(10*time.Millisecond))+1)*step, "at most one step per 10 ms in %v", elapsed)
}
