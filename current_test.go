package memctl

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"runtime/metrics"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/internal/procfs"
	"github.com/memctl/memctl/limits"
	"github.com/memctl/memctl/trim"
)

// childWiring makes the wiring mistake named by WIRING and reports what the
// package-level functions reached. slog.Default writes JSON on standard
// error.
func childWiring() {
	slog.SetDefault(slog.New(slog.NewJSONHandler(os.Stderr, nil)))
	opts := []Option{WithTrimDelay(10 * time.Millisecond), WithTrim(trim.Config{MinRelease: -1})}
	waitTrim := func(c *Controller) int64 {
		for deadline := time.Now().Add(20 * time.Second); c.Stats().Trim.Trims == 0 && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		return c.Stats().Trim.Trims
	}
	switch os.Getenv("WIRING") {
	case "nostart":
		AfterBurst()
		AfterBurst()
		Begin()()
	case "second-closed": // the newer is closed: the older serves again
		c1, _ := Start(opts...)
		c2, _ := Start(opts...)
		_ = c2.Close()
		AfterBurst()
		childtest.Say("C1_TRIMS", waitTrim(c1))
		_ = c1.Close()
	case "first-closed": // the older is closed: the newer still serves
		c1, _ := Start(opts...)
		c2, _ := Start(opts...)
		_ = c1.Close()
		AfterBurst()
		childtest.Say("C2_TRIMS", waitTrim(c2))
		_ = c2.Close()
		AfterBurst() // none live now
	default:
		childtest.Fail("unknown WIRING %q", os.Getenv("WIRING"))
	}
	childtest.Say("MISUSE", (*Controller)(nil).Stats().Misuse)
}

func runWiring(t *testing.T, which string) (map[string]string, []map[string]any) {
	t.Helper()
	cmd := childtest.Command(t, "wiring", []string{"MEMCTL", "MEMCTL_THP", "MEMCTL_TRIM_DELAY", "MEMCTL_ARENA_MAX"}, "WIRING="+which)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, stderr.String())
	return childtest.ParseReport(out), parseRecords(t, stderr.String())
}

func warnings(recs []map[string]any) []string {
	var w []string
	for _, r := range recs {
		if r["level"] == "WARN" {
			w = append(w, r["msg"].(string))
		}
	}
	return w
}

func TestAfterBurstWithoutStartWarnsOnce(t *testing.T) {
	r, recs := runWiring(t, "nostart")
	w := warnings(recs)
	require.Len(t, w, 1, "one WARN for three calls: %v", recs)
	assert.Contains(t, w[0], "AfterBurst called with no live controller")
	assert.Contains(t, w[0], "memctl.Start")
	assert.Equal(t, "3", r["MISUSE"], "every call counted")
}

func TestSecondStartWarnsAndOlderServesAfterNewerCloses(t *testing.T) {
	r, recs := runWiring(t, "second-closed")
	w := warnings(recs)
	require.Len(t, w, 1, "%v", recs)
	assert.Contains(t, w[0], "Start called while an earlier controller is live")
	for _, rec := range recs {
		if rec["level"] == "WARN" {
			assert.Contains(t, rec["earlier_start"], "childWiring", "names where the earlier Start was")
		}
	}
	assert.Equal(t, "1", r["C1_TRIMS"], "after the newer's Close, AfterBurst reaches the older (issue 14: it reached neither)")
	assert.Equal(t, "1", r["MISUSE"])

	r, recs = runWiring(t, "first-closed")
	assert.Equal(t, "1", r["C2_TRIMS"], "closing the older leaves the newer in place")
	w = warnings(recs)
	require.Len(t, w, 2, "%v", recs)
	assert.Contains(t, w[1], "no live controller", "after both Close, AfterBurst says so")
	assert.Equal(t, "2", r["MISUSE"])
}

func TestWiringLeavesNothingRunning(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, k := range []string{"MEMCTL", "MEMCTL_THP", "MEMCTL_TRIM_DELAY", "MEMCTL_ARENA_MAX"} {
		t.Setenv(k, "")
	}
	ctl1, _, _ := startInProcess(t)
	ctl2, _, _ := startInProcess(t)
	assert.Nil(t, current.Load(), "both closed: no controller")
	assert.NotSame(t, ctl1, ctl2)
}

const (
	threeRequests = 3
	requestBytes  = 31_000_000 // 29.6 MiB: under the 32 MiB threshold of a 64 MiB budget
)

// childThreeRequests serves three concurrent requests of 31 MB each through
// the budget middleware (64 MiB per request: a 32 MiB burst threshold, so
// none of them alone ends a burst), with memctl.AfterBurst as the hook
// unless MEMCTL_TEST_HOOK=none, and reports VmRSS before them and 3 s after
// the last one ended (later if a trim is still pending then).
func childThreeRequests() {
	ctl, err := Start(WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		childtest.Fail("%v", err)
	}
	defer ctl.Close()
	pool, err := limits.NewPool(limits.PoolConfig{Name: "pool", Limit: 200 << 20})
	if err != nil {
		childtest.Fail("%v", err)
	}
	defer pool.Close()
	hook := AfterBurst
	if os.Getenv("MEMCTL_TEST_HOOK") == "none" {
		hook = nil
	}
	mw, err := pool.Middleware(limits.HTTPConfig{Limit: 64 << 20, AfterBurst: hook})
	if err != nil {
		childtest.Fail("%v", err)
	}
	var all sync.WaitGroup
	all.Add(threeRequests)
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := limits.Grow(r.Context(), requestBytes); err != nil {
			limits.WriteError(w, err)
			all.Done()
			return
		}
		defer limits.Shrink(r.Context(), requestBytes)
		b := make([]byte, requestBytes)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		all.Done()
		all.Wait() // all three hold their 31 MB at once
		fmt.Fprintln(w, len(b))
	})))
	defer srv.Close()
	rss := func() int64 {
		n, err := procfs.RSS(0)
		if err != nil {
			childtest.Fail("%v", err)
		}
		return n
	}
	released := func() int64 {
		s := []metrics.Sample{{Name: "/memory/classes/heap/released:bytes"}}
		metrics.Read(s)
		return int64(s[0].Value.Uint64())
	}
	// The released heap is read with RSS, at both ends: what the heap
	// returned while the requests ran or ended is in the window too.
	before, released0 := rss(), released()
	var clients sync.WaitGroup
	codes := make(chan int, threeRequests)
	for range threeRequests {
		clients.Go(func() {
			resp, err := http.Get(srv.URL)
			if err != nil {
				codes <- 0
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			codes <- resp.StatusCode
		})
	}
	clients.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusOK {
			childtest.Fail("a request got %d", c)
		}
	}
	t0 := time.Now()
	time.Sleep(3 * time.Second)
	// A loaded machine may run the due trim later: wait for it, up to the
	// max wait and a delay more.
	for ctl.Stats().Trim.Pending && time.Since(t0) < ctl.trimmer.MaxWait()+ctl.trimmer.Delay() {
		time.Sleep(50 * time.Millisecond)
	}
	after, releasedAfter := rss(), released()
	s := ctl.Stats()
	// What the heap returned to the OS since RSS was first read, by a trim
	// or by the runtime's background scavenger.
	childtest.Say("RELEASED", releasedAfter-released0)
	childtest.Say("AFTER_MS", time.Since(t0).Milliseconds())
	childtest.Say("PENDING", s.Trim.Pending)
	childtest.Say("BEFORE", before)
	childtest.Say("AFTER", after)
	childtest.Say("TRIMS", s.Trim.Trims)
	childtest.Say("PEAK", pool.Stats().Peak)
}

// Issue 19: three concurrent requests of 31 MB each, every one under the
// middleware's per-request threshold, ended no burst and left 105 MiB
// resident. In a 256 MiB cgroup v1 memory cgroup, with the burst detector
// off so that the middleware alone must see them, VmRSS is back within
// 32 MiB of where it started 3 s after the last one ends (once its trim
// has run, on a loaded machine); the control (no hook) keeps them.
func TestMiddlewareThreeConcurrentRequestsTrim(t *testing.T) {
	if testing.Short() {
		t.Skip("a real-effect test of several seconds: skipped in -short")
	}
	if raceEnabled {
		t.Skip("the race detector's shadow memory makes RSS say nothing")
	}
	parent, err := cgrouptest.WritableParent()
	if err != nil {
		t.Skipf("needs a writable memory cgroup: %v", err)
	}
	g, err := parent.NewChild(fmt.Sprintf("memctl-i19-%d-%d", os.Getpid(), time.Now().UnixNano()), 256<<20)
	if err != nil {
		t.Skipf("cannot make a memory cgroup: %v", err)
	}
	t.Cleanup(func() { assert.NoError(t, g.Remove()) })
	run := func(env ...string) map[string]string {
		cmd := childtest.Command(t, "three-requests", []string{"MEMCTL", "MEMCTL_AUTOBURST", "MEMCTL_TRIM_DELAY", "MEMCTL_PRESSURE", "GOMEMLIMIT", "AUTOMEMLIMIT", "GOGC"},
			append([]string{"MEMCTL_PRESSURE=off"}, env...)...)
		g.Wrap(cmd)
		return childtest.Report(t, cmd)
	}
	mib := func(r map[string]string, k string) int64 {
		return childtest.RequireInt(t, r, k) >> 20
	}
	hooked := run("MEMCTL_AUTOBURST=off")
	none := run("MEMCTL_AUTOBURST=off", "MEMCTL_TEST_HOOK=none")
	auto := run() // the defaults: the detector sees them too
	for name, r := range map[string]map[string]string{"middleware": hooked, "no hook": none, "defaults": auto} {
		t.Logf("%s: RSS %d MiB before, %d MiB %s ms after the last request (%d MiB released meanwhile); pool peak %d MiB; %s trims", name, mib(r, "BEFORE"), mib(r, "AFTER"), r["AFTER_MS"], mib(r, "RELEASED"), mib(r, "PEAK"), r["TRIMS"])
		assert.Equal(t, "false", r["PENDING"], "%s: the due trim ran within the max wait", name)
	}
	assert.LessOrEqual(t, mib(hooked, "AFTER"), mib(hooked, "BEFORE")+32, "back within 32 MiB")
	assert.Equal(t, "1", hooked["TRIMS"], "one burst for the three")
	// The control runs no trim. Its RSS shows what the runtime alone gives
	// back in the same window: when the background scavenger has already
	// brought it within the same 32 MiB, the middleware's effect cannot be
	// told from the runtime's on this run, so the test says so and skips.
	// (The released-heap gauge cannot tell how much the scavenger returned:
	// the requests first reuse released pages, so its difference
	// understates it.)
	assert.Equal(t, "0", none["TRIMS"])
	if mib(none, "AFTER") <= mib(none, "BEFORE")+32 {
		t.Skipf("the control, with no trim, is back within 32 MiB too (%d -> %d MiB): the runtime returned the requests' memory on its own here, so this run cannot show the middleware's trim",
			mib(none, "BEFORE"), mib(none, "AFTER"))
	}
	assert.LessOrEqual(t, mib(auto, "AFTER"), mib(auto, "BEFORE")+32, "with the defaults too")
	runtime.KeepAlive(g)
}
