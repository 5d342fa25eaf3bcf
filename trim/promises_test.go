package trim

import (
	"bytes"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The tests of this file are the regression tests of issue 13's inputs; the
// contended trim (input 1 on a real CPU quota) is the harness scenario
// "load-contended" of ./bench.

// logBuf is a concurrency-safe buffer for a text slog.Logger.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// count returns the lines at level that contain msg.
func (l *logBuf) count(level, msg string) int {
	n := 0
	for line := range strings.SplitSeq(l.String(), "\n") {
		if strings.Contains(line, "level="+level) && strings.Contains(line, msg) {
			n++
		}
	}
	return n
}

func newLog() (*logBuf, *slog.Logger) {
	b := &logBuf{}
	return b, slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// Input 1: in a CPU-throttled container a trim takes about 400 ms of wall
// time for a few tens of ms of CPU. Bursts every 4 s must all be trimmed:
// the limit counts the CPU (30 ms → next trim 1.5 s after), not the wall
// time (400 ms × 49 = 20 s under the old rule).
func TestThrottledTrimsAreNotHeldOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStep{took: 400 * time.Millisecond, cpu: 30 * time.Millisecond}
		tr := newFake(t, f)
		defer tr.Close()
		for range 6 {
			tr.AfterBurst()
			time.Sleep(4 * time.Second)
		}
		time.Sleep(time.Minute)
		assert.Len(t, f.starts(), 6, "each of 6 bursts 4 s apart is trimmed")
		s := tr.Stats()
		assert.Equal(t, 30*time.Millisecond, s.LastCPU)
		assert.Equal(t, 6*30*time.Millisecond, s.TotalCPU)
		assert.Zero(t, s.Deferred)
	})
}

// A trim that costs a lot of CPU holds the next one off 50 times its charge
// from its start.
func TestCPULimitSpacing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStep{took: 10 * time.Millisecond, cpu: 200 * time.Millisecond}
		tr := newFake(t, f)
		defer tr.Close()
		t0 := time.Now()
		tr.AfterBurst()
		time.Sleep(testDelay + testDelay/10)
		require.Equal(t, 1, f.finished())
		tr.AfterBurst() // due 2 s later, but the limit says 50 × 200 ms = 10 s from the first start
		time.Sleep(time.Minute)
		got := since(t0, f.starts())
		require.Len(t, got, 2)
		assert.GreaterOrEqual(t, got[1], got[0]+10*time.Second)
		assert.LessOrEqual(t, got[1], got[0]+10*time.Second+testDelay/20)
	})
}

// Input 2: a slow trim after fast ones must not break the bound. Trims
// whose charge varies tenfold, bursts every 1.2 s for 10 minutes with a
// short delay: for every pair of trims i < j, the CPU charged to the trims
// that started in [start i, start j) is at most 2% of that window, so that
// over any window W the charge is at most 2% of W plus one trim.
func TestCPUShareOverAnyWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStep{}
		costs := []time.Duration{5 * time.Millisecond, 50 * time.Millisecond, 5 * time.Millisecond, 5 * time.Millisecond, 120 * time.Millisecond}
		var n atomic.Int64
		var charged []time.Duration
		var mu sync.Mutex
		step := func() int64 {
			c := costs[n.Add(1)%int64(len(costs))]
			mu.Lock()
			charged = append(charged, c)
			mu.Unlock()
			f.cpu = c
			return f.run()
		}
		cfg := fakeConfig(f)
		cfg.Delay, cfg.goStep = 100*time.Millisecond, step
		tr := mustNew(t, cfg)
		defer tr.Close()
		t0 := time.Now()
		for time.Since(t0) < 10*time.Minute {
			tr.AfterBurst()
			time.Sleep(1200 * time.Millisecond)
		}
		time.Sleep(time.Minute)
		starts := f.starts()
		mu.Lock()
		defer mu.Unlock()
		require.Greater(t, len(starts), 50)
		var total time.Duration
		for i := range starts {
			var sum time.Duration
			for j := i + 1; j < len(starts); j++ {
				sum += charged[j-1]
				w := starts[j].Sub(starts[i])
				require.LessOrEqual(t, float64(sum), cpuShare*float64(w)+1,
					"trims %d..%d: %v of CPU in %v", i, j-1, sum, w)
			}
			total += charged[i]
		}
		wall := starts[len(starts)-1].Sub(starts[0])
		t.Logf("%d trims, %v of CPU in %v: %.2f%%", len(starts), total, wall, 100*float64(total-charged[len(starts)-1])/float64(wall))
	})
}

// A trim deferred past the max wait by the CPU limit is counted and logged
// once at INFO.
func TestDeferredPastMaxWaitLoggedOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStep{cpu: time.Second} // next trim 50 s after
		tr, logs := newFakeLogged(t, f)
		defer tr.Close()
		for range 3 {
			tr.AfterBurst()
			time.Sleep(5 * time.Second)
			tr.AfterBurst()
			time.Sleep(time.Minute)
		}
		assert.Len(t, f.starts(), 4)
		assert.Equal(t, int64(3), tr.Stats().Deferred, "the trims after the first waited past the 20 s max wait")
		assert.Equal(t, 1, logs.count("INFO", "deferred past the max wait"), logs.String())
	})
}

// Input 3a: requests marked with Begin, ended 150 ms later, 50 ms apart, for
// 45 s: never a quiet Delay, yet a trim runs every max wait (20 s).
func TestBackToBackRequestsDoNotStarve(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStep{}
		tr := newFake(t, f)
		defer tr.Close()
		t0 := time.Now()
		var wg sync.WaitGroup
		for time.Since(t0) < 45*time.Second {
			end := tr.Begin()
			wg.Go(func() { time.Sleep(150 * time.Millisecond); end() })
			time.Sleep(50 * time.Millisecond)
		}
		wg.Wait()
		got := since(t0, f.starts())
		require.Len(t, got, 2, "trims at the max wait: %v", got)
		for i, d := range got {
			lo := time.Duration(i+1) * tr.MaxWait()
			assert.GreaterOrEqual(t, d, lo, "trim %d", i)
			assert.LessOrEqual(t, d, lo+time.Duration(i+1)*(testDelay/20+50*time.Millisecond), "trim %d", i)
		}
	})
}

// Input 3b: two overlapping streams of Begin/end, never a moment with none in
// flight, for 10 minutes: a trim every max wait, and no Begin is reported
// stale (each is ended within 3 s).
func TestOverlappingStreamsDoNotStarve(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStep{}
		tr, logs := newFakeLogged(t, f)
		defer tr.Close()
		t0 := time.Now()
		var wg sync.WaitGroup
		for s := range 2 {
			wg.Go(func() {
				time.Sleep(time.Duration(s) * 1500 * time.Millisecond)
				for time.Since(t0) < 10*time.Minute {
					end := tr.Begin()
					time.Sleep(3 * time.Second)
					end()
				}
			})
		}
		time.Sleep(time.Second)
		for time.Since(t0) < 10*time.Minute {
			require.Positive(t, tr.Stats().InFlight, "never a moment with none in flight")
			time.Sleep(700 * time.Millisecond)
		}
		wg.Wait()
		n := len(f.starts())
		assert.GreaterOrEqual(t, n, 28, "about one trim per 20 s in 10 minutes")
		assert.LessOrEqual(t, n, 31)
		assert.Zero(t, tr.Stats().StaleBegins)
		assert.Zero(t, logs.count("WARN", "not ended"))
	})
}

// Input 3c: one Begin whose end is lost: the trim still runs at the max
// wait, and the lost end is reported once (WARN and Stats.StaleBegins).
func TestLostEndIsReportedAndDoesNotStarve(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStep{}
		tr, logs := newFakeLogged(t, f)
		defer tr.Close()
		t0 := time.Now()
		_ = tr.Begin() // its end is lost
		var wg sync.WaitGroup
		for time.Since(t0) < 2*time.Minute {
			end := tr.Begin()
			wg.Go(func() { time.Sleep(100 * time.Millisecond); end() })
			time.Sleep(time.Second)
		}
		wg.Wait()
		got := since(t0, f.starts())
		require.GreaterOrEqual(t, len(got), 5, "trims despite the lost end: %v", got)
		assert.LessOrEqual(t, got[0], tr.MaxWait()+testDelay/20)
		s := tr.Stats()
		assert.Equal(t, int64(1), s.StaleBegins)
		assert.Equal(t, int64(1), s.InFlight)
		assert.Equal(t, 1, logs.count("WARN", "not ended for longer than the max wait"), logs.String())
	})
}

// Input 7: an extra end is counted and logged once, never panics in
// production; it panics under Config.Strict.
func TestExtraEnd(t *testing.T) {
	logs, logger := newLog()
	tr, err := newT(withLazy(testConfig{Config: Config{NoCHeap: true, Logger: logger}}, false, nil))
	require.NoError(t, err)
	defer tr.Close()
	end := tr.Begin()
	end()
	assert.NotPanics(t, end)
	assert.NotPanics(t, end)
	s := tr.Stats()
	assert.Equal(t, int64(2), s.Misuse)
	assert.Equal(t, int64(0), s.InFlight, "counter restored")
	assert.Equal(t, 1, logs.count("WARN", "ended more often than begun"), logs.String())
	end = tr.Begin()
	assert.Equal(t, int64(1), tr.Stats().InFlight)
	end()

	strict, err := newT(withLazy(testConfig{Config: Config{NoCHeap: true, Strict: true}}, false, nil))
	require.NoError(t, err)
	defer strict.Close()
	end = strict.Begin()
	end()
	assert.PanicsWithValue(t, "trim: burst ended more often than begun", end)
	assert.Equal(t, int64(1), strict.Stats().Misuse)
	assert.Equal(t, int64(0), strict.Stats().InFlight, "counter restored after the panic")
}

// fakeCHeapRetained is a C heap step with a given Retained figure that counts
// its releases.
type fakeCHeapRetained struct {
	retained int64
	releases atomic.Int64
}

func (*fakeCHeapRetained) Allocator() string { return "fake" }
func (h *fakeCHeapRetained) Retained() int64 { return h.retained }
func (h *fakeCHeapRetained) ReleaseOver(int64) (int64, error) {
	h.releases.Add(1)
	return 1 << 20, nil
}

// Inputs 4 and 5: each step decides for itself. An unknown C figure
// (mimalloc) runs the C step even when the Go heap has nothing to give; a
// small C figure (glibc after a release) skips the C step and does not
// make the Go step run.
func TestEachStepDecides(t *testing.T) {
	for _, tc := range []struct {
		name            string
		goEst, cRet     int64
		goRuns, cRuns   bool
		goSkip, cSkip   int64
		skipped, trims  int64
		wantReleasedMiB int64
	}{
		{"C unknown, Go small", 40 << 10, -1, false, true, 1, 0, 0, 1, 1},
		{"C small, Go small", 40 << 10, 1 << 20, false, false, 0, 0, 1, 0, 0},
		{"C large, Go small", 40 << 10, 100 << 20, false, true, 1, 0, 0, 1, 1},
		{"C small, Go large", 100 << 20, 1 << 20, true, false, 0, 1, 0, 1, 1},
		{"both large", 100 << 20, 100 << 20, true, true, 0, 0, 0, 1, 2},
		{"Go unknown, C small", -1, 0, true, false, 0, 1, 0, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := &fakeStep{}
				h := &fakeCHeapRetained{retained: tc.cRet}
				cfg := fakeConfig(f)
				cfg.NoCHeap, cfg.cheap = false, h
				cfg.estimate = func() int64 { return tc.goEst }
				tr := mustNew(t, cfg)
				defer tr.Close()
				tr.AfterBurst()
				time.Sleep(time.Minute)
				assert.Equal(t, tc.goRuns, f.finished() == 1, "Go step ran")
				assert.Equal(t, tc.cRuns, h.releases.Load() == 1, "C step ran")
				s := tr.Stats()
				assert.Equal(t, tc.goSkip, s.GoSkipped)
				assert.Equal(t, tc.cSkip, s.CSkipped)
				assert.Equal(t, tc.skipped, s.Skipped)
				assert.Equal(t, tc.trims, s.Trims)
				assert.Equal(t, tc.wantReleasedMiB<<20, s.TotalReleased)
			})
		})
	}
}

// Input 6: under lazy release the bytes that stay in RSS as LazyFree are
// counted apart, and the setting is said at New.
func TestLazyReleaseCounted(t *testing.T) {
	logs, logger := newLog()
	var lazyFree atomic.Int64
	f := &fakeStep{}
	step := func() int64 {
		lazyFree.Add(900 << 10) // 0.9 MiB of the 1 MiB released stays as LazyFree
		return f.run()
	}
	tr, err := newT(withLazy(testConfig{Config: Config{NoCHeap: true, Logger: logger}, hooks: hooks{goStep: step, cpuClock: f.clock}},
		true, func() int64 { return lazyFree.Load() }))
	require.NoError(t, err)
	defer tr.Close()
	assert.Equal(t, 1, logs.count("INFO", "RSS falls only under memory pressure"), logs.String())
	_, err = tr.TrimNow()
	require.NoError(t, err)
	s := tr.Stats()
	assert.True(t, s.Lazy)
	assert.Equal(t, int64(1<<20), s.LastReleased)
	assert.Equal(t, int64(900<<10), s.LastLazy)
	assert.Equal(t, int64(900<<10), s.TotalLazy)

	// Eager release does not read LazyFree.
	eager, err := newT(withLazy(testConfig{Config: Config{NoCHeap: true}, hooks: hooks{goStep: f.run}}, false, func() int64 { panic("read") }))
	require.NoError(t, err)
	defer eager.Close()
	_, err = eager.TrimNow()
	require.NoError(t, err)
	assert.Zero(t, eager.Stats().LastLazy)
}

func TestLazyFrom(t *testing.T) {
	for _, tc := range []struct {
		env, build string
		lazy       bool
	}{
		{"", "", false},
		{"madvdontneed=0", "", true},
		{"madvdontneed=1", "", false},
		{"gctrace=1,madvdontneed=0", "", true},
		{"madvdontneed=0,madvdontneed=1", "", false}, // the last wins
		{"madvdontneed=1,madvdontneed=0", "", true},
		{"madvdontneed=x", "", false}, // not an integer: ignored by the runtime
		{"", "madvdontneed=0", true},  // //go:debug madvdontneed=0
		{"madvdontneed=1", "madvdontneed=0", false},
		{"madvdontneed=0", "madvdontneed=1", true},
		{" madvdontneed=0", "", false}, // the runtime trims no space
		{"madvdontneed=+0", "", true},
		{"madvdontneed=4294967296", "", false}, // not an int32: ignored
		{"xmadvdontneed=0", "", false},
	} {
		lazy, why := lazyFrom(tc.env, tc.build)
		if !linux {
			assert.False(t, lazy)
			continue
		}
		assert.Equal(t, tc.lazy, lazy, "GODEBUG=%q default %q", tc.env, tc.build)
		if lazy {
			assert.Contains(t, why, "madvdontneed=0")
		}
	}
}

// Input 1, the charge itself: under a CPU quota the runtime's GC figures
// are inflated (worker time while throttled), so the charge is at most the
// process's real CPU time; without a quota, the process's CPU time counts
// the rest of the program, so the charge is at most the GC figures plus the
// thread's CPU.
func TestChargeTakesTheSmaller(t *testing.T) {
	ms := time.Millisecond
	base := cpuMark{gc: 10 * ms, thread: 5 * ms, process: 100 * ms}
	for _, tc := range []struct {
		name string
		now  cpuMark
		want time.Duration
	}{
		{"throttled: GC figure inflated", cpuMark{gc: 1110 * ms, thread: 25 * ms, process: 190 * ms}, 90 * ms},
		{"busy program: process counts other work", cpuMark{gc: 70 * ms, thread: 45 * ms, process: 400 * ms}, 100 * ms},
		{"process clock unknown", cpuMark{gc: 70 * ms, thread: 45 * ms, process: -1}, 100 * ms},
		{"clocks went back", cpuMark{gc: 0, thread: 0, process: 0}, 0},
	} {
		assert.Equal(t, tc.want, base.charge(tc.now), tc.name)
	}
	unknown := cpuMark{gc: 10 * ms, thread: 5 * ms, process: -1}
	assert.Equal(t, 100*ms, unknown.charge(cpuMark{gc: 70 * ms, thread: 45 * ms, process: 400 * ms}))
}

// The real clocks move with CPU burnt on the locked thread, and the
// process clock's window holds the thread clock's.
func TestReadCPU(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	m0 := readCPU(true)
	// Busy until the kernel's own count of this thread's time on a CPU
	// (/proc/thread-self/schedstat, nanoseconds) grew by 30 ms: a loop
	// timed by the wall clock gets less CPU than that on a loaded machine.
	s0, ok := schedstatCPU()
	for t0 := time.Now(); time.Since(t0) < 30*time.Millisecond || ok && schedstatDelta(s0) < 30*time.Millisecond; {
		if time.Since(t0) > 20*time.Second {
			t.Fatal("30 ms of CPU not scheduled in 20 s")
		}
	}
	m1 := readCPU(false)
	if !linux {
		assert.Equal(t, time.Duration(-1), m1.process)
		return
	}
	if !ok {
		t.Skip("no /proc/thread-self/schedstat to measure the busy loop's CPU against")
	}
	assert.GreaterOrEqual(t, m1.thread-m0.thread, 25*time.Millisecond, "thread CPU (30 ms by schedstat)")
	assert.GreaterOrEqual(t, m1.process-m0.process, m1.thread-m0.thread, "process CPU holds the thread's")
	assert.GreaterOrEqual(t, m0.charge(m1), 10*time.Millisecond)
}

// schedstatCPU returns the calling thread's time on a CPU from
// /proc/thread-self/schedstat (its first field, nanoseconds; kernel
// Documentation/scheduler/sched-stats.rst), and false when it cannot be read.
func schedstatCPU() (time.Duration, bool) {
	b, err := os.ReadFile("/proc/thread-self/schedstat")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, false
	}
	n, err := strconv.ParseInt(f[0], 10, 64)
	return time.Duration(n), err == nil
}

func schedstatDelta(s0 time.Duration) time.Duration {
	s, _ := schedstatCPU()
	return s - s0
}
