package limits

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func init() {
	children["pressure-recovers"] = childPressureRecovers
}

// TestPressureRecoversInCgroup (issue 11, input 6): in a real 256 MiB
// cgroup v1 (or v2) memory cgroup, GOMEMLIMIT 230 MiB, the heap-pressure
// guard with CancelLargest and no trimming: one request that builds 600 MiB
// is canceled (429), then ten 1 MiB requests 0.5 s apart are all served,
// and the pressure reading clears within a second of the cancel (the pool
// runs a GC when the canceled request ends). Nothing is OOM-killed.
func TestPressureRecoversInCgroup(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's shadow memory does not fit a 256 MiB cgroup")
	}
	parent, err := cgrouptest.WritableParent()
	if err != nil {
		t.Skipf("no child memory cgroup can be made here: %v", err)
	}
	g, err := parent.NewChild(fmt.Sprintf("memctl-i11-pressure-%d", os.Getpid()), 256<<20)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, g.Remove()) })
	cmd := childtest.Command(t, "pressure-recovers", []string{"GOGC", "GOMEMLIMIT", "MEMCTL", "MEMCTL_BUDGETS"}, "GOMEMLIMIT=230MiB")
	g.Wrap(cmd)
	r := childtest.Report(t, cmd)
	t.Logf("child: %v", r)
	kills, err := g.OOMKills()
	require.NoError(t, err)
	assert.Zero(t, kills, "nothing OOM-killed")
	assert.Equal(t, "429", r["BIG_CODE"])
	assert.Equal(t, "1", r["CANCELED"])
	assert.Equal(t, strings.TrimSuffix(strings.Repeat("200,", 10), ","), r["SMALL_CODES"], "every small request served")
	ms := childtest.RequireFloat(t, r, "RECOVERY_MS") // the pressure cleared
	assert.Less(t, ms, 1000.0, "pressure cleared within a second of the cancel")
	assert.Equal(t, "0", r["USED_AT_END"])
}

func childPressureRecovers() {
	p, err := NewPool(PoolConfig{Name: "srv", Limit: 1 << 30, CancelLargest: true, Strict: true})
	if err != nil {
		childtest.Fail("%v", err)
	}
	defer p.Close()
	mw, err := p.Middleware(HTTPConfig{Limit: Unlimited})
	if err != nil {
		childtest.Fail("%v", err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mibs, _ := strconv.Atoi(r.URL.Query().Get("mib"))
		var held [][]byte
		defer func() { Shrink(r.Context(), int64(len(held))*mib) }()
		for range mibs {
			if err := Grow(r.Context(), mib); err != nil {
				if !WriteError(w, err) {
					http.Error(w, err.Error(), http.StatusInternalServerError)
				}
				return
			}
			b := make([]byte, mib)
			for i := 0; i < len(b); i += 4096 {
				b[i] = 1
			}
			held = append(held, b)
		}
		fmt.Fprintln(w, len(held))
	})))
	defer srv.Close()
	get := func(mibs int) int {
		resp, err := http.Get(srv.URL + "/?mib=" + strconv.Itoa(mibs))
		if err != nil {
			childtest.Fail("%v", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	childtest.Say("BIG_CODE", get(600))
	canceledAt := time.Now()
	childtest.Say("CANCELED", p.Stats().Canceled)
	// Watch for the pressure to clear while the small requests run.
	ctx, stop := context.WithCancel(context.Background())
	cleared := make(chan time.Duration, 1)
	go func() {
		for ctx.Err() == nil {
			if !p.Stats().UnderHeapPressure {
				cleared <- time.Since(canceledAt)
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	var codes []string
	for range 10 {
		time.Sleep(500 * time.Millisecond)
		codes = append(codes, strconv.Itoa(get(1)))
	}
	stop()
	childtest.Say("SMALL_CODES", strings.Join(codes, ","))
	select {
	case d := <-cleared:
		childtest.Say("RECOVERY_MS", float64(d.Microseconds())/1000)
	default:
		childtest.Say("RECOVERY_MS", "never")
	}
	st := p.Stats()
	childtest.Say("USED_AT_END", st.Used)
	childtest.Say("GC_CYCLES", st.GCCycles)
	childtest.Say("HEAP_LIVE", st.HeapLive)
	childtest.Say("REFUSED", st.Refused)
}
