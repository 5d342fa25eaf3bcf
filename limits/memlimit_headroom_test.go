package limits

import (
	"errors"
	"runtime/debug"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/internal/chold"
)

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
		for i := 0; debug.SetMemoryLimit(-1) == d.GoMemLimit && time.Since(start) < 20*time.Second; i++ {
			sink = make([]byte, 1<<20) // garbage: GC cycles, and so refreshes
			if i%64 == 0 {
				time.Sleep(time.Millisecond)
			}
		}
		_ = sink
		childtest.Say("FREED_GOMEMLIMIT", debug.SetMemoryLimit(-1))
		childtest.Say("FREED_OUTSIDE", m.Last().Outside)
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
