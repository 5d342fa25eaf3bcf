package trim

import (
	"bytes"
	"cmp"
	"fmt"
	"log/slog"
	"math"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/memctl/memctl/internal/burst"
	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/childtest"
)

const testDelay = 2 * time.Second

// fakeStep is a Go heap step that records when it ran, takes took of wall
// time and is charged cpu (took when cpu is 0) by the fake CPU clock of
// newFake.
type fakeStep struct {
	took time.Duration
	cpu  time.Duration

	charged atomic.Int64 // total CPU charged, read by clock

	mu    sync.Mutex
	start []time.Time
	ends  []time.Time
}

func (f *fakeStep) run() int64 {
	f.mu.Lock()
	f.start = append(f.start, time.Now())
	f.mu.Unlock()
	time.Sleep(f.took)
	f.charged.Add(int64(cmp.Or(f.cpu, f.took)))
	f.mu.Lock()
	f.ends = append(f.ends, time.Now())
	f.mu.Unlock()
	return 1 << 20
}

// clock is the fake CPU clock: what the fake steps were charged so far.
func (f *fakeStep) clock() time.Duration { return time.Duration(f.charged.Load()) }

func (f *fakeStep) starts() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Time(nil), f.start...)
}

func (f *fakeStep) finished() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.ends)
}

// withLazy sets the test hooks that replace the detection of lazy release
// and the LazyFree reading, and returns c.
func withLazy(c testConfig, lazy bool, lazyFree func() int64) testConfig {
	c.lazy = func() (bool, string) { return lazy, "test" }
	c.lazyFree = lazyFree
	return c
}

// fakeConfig is the Config of a strict Trimmer with delay testDelay whose
// Go heap step is f.run, charged by f's CPU clock, whose estimate always
// says there is plenty to release, without C heap step, with eager
// release and no CPU throttling counter.
func fakeConfig(f *fakeStep) testConfig {
	c := testConfig{Config: Config{Delay: testDelay, NoCHeap: true, Strict: true}, hooks: hooks{goStep: f.run, estimate: func() int64 { return 1 << 30 }, cpuClock: f.clock, scan: func() int64 { return 0 }, throttled: func(bool) (time.Duration, error) { return 0, cgroupfs.ErrNoThrottleCounter }}}
	return withLazy(c, false, nil)
}

// newFake returns a Trimmer of fakeConfig(f).
func newFake(t *testing.T, f *fakeStep) *Trimmer { t.Helper(); return mustNew(t, fakeConfig(f)) }

// mustNew returns a Trimmer of c and fails the test on an error.
func mustNew[C Config | testConfig](t *testing.T, c C) *Trimmer {
	t.Helper()
	tc, ok := any(c).(testConfig)
	if !ok {
		tc.Config = any(c).(Config)
	}
	tr, err := newT(tc)
	require.NoError(t, err)
	return tr
}

// hooks are the fakes a test sets; nil means the real thing.
type hooks struct {
	goStep       func() int64 // the Go step; without noGCStep, the GC path only
	estimate     func() int64 // every estimate, with a GC and (without noGCEstimate) without
	noGCStep     func() (released int64, steps int, why abortReason, broken bool)
	noGCEstimate func() int64
	cpuClock     func() time.Duration
	lazy         func() (bool, string)
	lazyFree     func() int64
	throttled    func(fresh bool) (time.Duration, error)
	scan         func() int64
	cheap        cHeap
	hold         func(func())
}

// set sets *p to v unless v is nil.
func set[F any](p *F, v F) {
	if any(v) != nil && !reflect.ValueOf(v).IsNil() {
		*p = v
	}
}

// testConfig is a Config with a test's fakes.
type testConfig struct {
	Config
	hooks
}

// newT returns a Trimmer of c's Config with c's fakes.
func newT(c testConfig) (*Trimmer, error) {
	d, h := realDeps, c.hooks
	if h.goStep != nil {
		d.goStep, d.gcOnly = h.goStep, h.noGCStep == nil
	}
	if h.estimate != nil {
		d.estimate = func(*Trimmer, bool) (int64, int64) { v := h.estimate(); return v, v }
		d.noGCEst = h.estimate
	}
	if h.cpuClock != nil {
		d.readCPU = func(bool) cpuMark { v := h.cpuClock(); return cpuMark{gc: v, process: v} }
	}
	if h.throttled != nil {
		d.throttle = func() func(bool) (time.Duration, error) { return h.throttled }
	}
	if h.cheap != nil {
		d.cheap = func() cHeap { return h.cheap }
	}
	set(&d.noGCStep, h.noGCStep)
	set(&d.noGCEst, h.noGCEstimate)
	set(&d.lazy, h.lazy)
	set(&d.lazyFree, h.lazyFree)
	set(&d.scan, h.scan)
	set(&d.hold, h.hold)
	return newTrimmer(c.Config, d)
}

// since returns the offsets of ts from t0.
func since(t0 time.Time, ts []time.Time) []time.Duration {
	var d []time.Duration
	for _, t := range ts {
		d = append(d, t.Sub(t0))
	}
	return d
}

// assertWindow checks that got is in [base+Delay, base+Delay*1.1].
func assertWindow(t *testing.T, got, base time.Duration) {
	t.Helper()
	assert.GreaterOrEqual(t, got, base+testDelay, "trim before Delay after the last call")
	assert.LessOrEqual(t, got, base+testDelay+testDelay/10, "trim later than Delay+10%% after the last call")
}

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

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func TestCloseWhilePending(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStep{}
		tr := newFake(t, f)
		tr.AfterBurst()
		time.Sleep(time.Second)
		require.NoError(t, tr.Close())
		assert.True(t, tr.quiet())
		tr.AfterBurst()
		end := tr.Begin()
		end()
		assert.True(t, tr.quiet(), "AfterBurst after Close arms nothing")
		time.Sleep(time.Minute)
		assert.Empty(t, f.starts(), "Close stops a pending trim")
		assert.Equal(t, 0, trimmerGoroutines())
		require.NoError(t, tr.Close(), "Close is idempotent")
	})
}

func TestCloseWaitsForRunningTrim(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStep{took: time.Second}
		tr := newFake(t, f)
		t0 := time.Now()
		tr.AfterBurst()
		time.Sleep(testDelay + testDelay/10) // trim running until ~3.1 s
		require.Len(t, f.starts(), 1)
		require.Equal(t, 0, f.finished())
		require.NoError(t, tr.Close())
		assert.Equal(t, 1, f.finished(), "Close returns after the running trim")
		assert.GreaterOrEqual(t, time.Since(t0), since(t0, f.starts())[0]+f.took)
		assert.True(t, tr.quiet())
	})
}

func TestBadConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Delay: -time.Second}, "trim: Config.Delay -1s: want 0 (the default, 2s) or at least 1ms and at most 24h0m0s"},
		{Config{Delay: -1}, "trim: Config.Delay -1ns: want 0 (the default, 2s) or at least 1ms"},
		{Config{Delay: time.Microsecond}, "trim: Config.Delay 1µs"},
		{Config{MaxWait: -time.Second}, "trim: Config.MaxWait -1s: want 0 (the default, 10 delays) or at least the delay and at most 240h0m0s"},
		{Config{MaxWait: -1}, "trim: Config.MaxWait -1ns: want 0 (the default, 10 delays) or at least the delay"},
		{Config{MaxWait: math.MaxInt64}, "trim: Config.MaxWait 2562047h47m16.854775807s: want 0 (the default, 10 delays) or at least the delay and at most 240h0m0s"},
		{Config{Delay: 2562047 * time.Hour}, "trim: Config.Delay 2562047h0m0s: want 0 (the default, 2s) or at least 1ms and at most 24h0m0s"},
		{Config{Delay: maxDelay + 1}, "trim: Config.Delay 24h0m0.000000001s: want 0 (the default, 2s) or at least 1ms and at most 24h0m0s"},
		{Config{Delay: math.MinInt64}, "trim: Config.Delay -2562047h47m16.854775808s"},
		{Config{MaxWait: time.Second}, "trim: Config.MaxWait 1s is shorter than the delay 2s"},
		{Config{Delay: time.Minute, MaxWait: 59 * time.Second}, "trim: Config.MaxWait 59s is shorter than the delay 1m0s"},
	} {
		tr, err := New(tc.cfg)
		assert.Nil(t, tr)
		if assert.Error(t, err) {
			assert.Contains(t, err.Error(), tc.want)
		}
	}
	tr := mustNew(t, Config{Delay: minDelay, MinRelease: neverSkip})
	assert.Equal(t, minDelay, tr.Delay())
	assert.Zero(t, tr.minRelease, "neverSkip: every estimate reaches the threshold")
	require.NoError(t, tr.Close())

	// The zero Config is the default.
	tr = mustNew(t, Config{})
	assert.Equal(t, defaultDelay, tr.Delay())
	assert.Equal(t, maxWaitFactor*defaultDelay, tr.MaxWait())
	assert.Equal(t, defaultMinRelease, tr.minRelease)
	assert.Equal(t, realDeps.cheap().Allocator(), tr.Stats().CHeapAllocator)
	require.NoError(t, tr.Close())

	// Any negative MinRelease never skips; NoCHeap turns the C step off.
	tr = mustNew(t, Config{MinRelease: -5, NoCHeap: true})
	assert.Zero(t, tr.minRelease)
	assert.Nil(t, tr.cheap)
	assert.Empty(t, tr.Stats().CHeapAllocator)
	require.NoError(t, tr.Close())

	// The longest delay: its default max wait does not overflow.
	tr = mustNew(t, Config{Delay: maxDelay, NoCHeap: true})
	assert.Equal(t, maxWaitFactor*maxDelay, tr.MaxWait())
	assert.Positive(t, tr.MaxWait())
	require.NoError(t, tr.Close())
}

func TestNilTrimmer(t *testing.T) {
	var tr *Trimmer
	tr.AfterBurst()
	tr.Begin()()
	_, err := tr.TrimNow()
	assert.NoError(t, err)
	assert.Equal(t, Stats{}, tr.Stats())
	assert.NoError(t, tr.Close())
}

// TestRealClock runs a Trimmer on the real clock with the real Go heap step,
// then checks that Close leaves no goroutine behind.
func TestRealClock(t *testing.T) {
	defer goleak.VerifyNone(t)
	tr, err := New(Config{Delay: 20 * time.Millisecond, MinRelease: neverSkip, NoCHeap: true})
	require.NoError(t, err)
	tr.AfterBurst()
	deadline := time.Now().Add(10 * time.Second)
	for tr.Stats().Trims == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	s := tr.Stats()
	assert.Equal(t, int64(1), s.Trims)
	assert.Positive(t, s.LastDuration)
	t.Logf("real trim took %v, released %d bytes", s.LastDuration, s.LastReleased)

	tr.AfterBurst() // pending when closed
	require.NoError(t, tr.Close())
}

// TestConcurrentUse hammers AfterBurst, Begin/end, Stats and TrimNow from
// many goroutines (for -race), then checks that Close leaves nothing.
func TestConcurrentUse(t *testing.T) {
	defer goleak.VerifyNone(t)
	var n sync.WaitGroup
	var steps sync.Mutex
	count := 0
	tr, err := newT(testConfig{Config: Config{Delay: time.Millisecond, NoCHeap: true, MinRelease: neverSkip}, hooks: hooks{goStep: func() int64 { steps.Lock(); count++; steps.Unlock(); return 0 }}})
	require.NoError(t, err)
	stop := make(chan struct{})
	for i := range 8 {
		n.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				switch i % 4 {
				case 0, 1:
					tr.AfterBurst()
				case 2:
					end := tr.Begin()
					runtime.Gosched()
					end()
				case 3:
					_ = tr.Stats()
					if i == 3 {
						_, _ = tr.TrimNow()
						time.Sleep(time.Millisecond)
					}
				}
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	n.Wait()
	require.NoError(t, tr.Close())
	s := tr.Stats()
	assert.Equal(t, int64(0), s.InFlight)
	assert.False(t, s.Pending)
	assert.True(t, tr.quiet())
	t.Logf("stats: %+v, steps %d", s, count)
	assert.Equal(t, fmt.Sprint(count), fmt.Sprint(s.Trims))
}

// Close must not wait for a TrimNow running in another goroutine, even when
// a tick fired while it ran (found by an adversarial review).
func TestCloseDoesNotWaitForForeignTrimNow(t *testing.T) {
	release := make(chan struct{})
	var calls atomic.Int32
	entered := make(chan struct{})
	step := func() int64 {
		if calls.Add(1) == 1 {
			close(entered)
			<-release
		}
		return 0
	}
	tr, err := newT(testConfig{Config: Config{Delay: 20 * time.Millisecond, NoCHeap: true}, hooks: hooks{goStep: step, estimate: func() int64 { return 1 << 30 }}})
	if err != nil {
		t.Fatal(err)
	}
	go tr.TrimNow()
	<-entered
	tr.AfterBurst()                   // tick in 1 ms, which blocks on the run lock
	time.Sleep(20 * time.Millisecond) // the tick has fired
	closed := make(chan struct{})
	go func() { tr.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second): // a bound on a hang (the TrimNow never ends by itself), not a timing
		t.Errorf("Close blocked while a TrimNow in another goroutine runs")
	}
	close(release)
	<-closed
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

// TrimNow is forced and counted by name.
func TestTrimNowByName(t *testing.T) {
	f := &fakeStep{}
	cfg := fakeConfig(f)
	cfg.estimate = func() int64 { return 0 }
	tr := mustNew(t, cfg)
	defer tr.Close()
	_, err := tr.TrimNow()
	require.NoError(t, err)
	assert.Equal(t, int64(1), tr.Stats().ByName.Trims)
	assert.Len(t, f.starts(), 1)
}

const (
	liveBytes  = 20 << 20
	burstBytes = 256 << 20
	settle     = 3 * time.Second
)

// burstChild holds 20 MiB live, allocates and drops a 256 MiB burst, calls
// AfterBurst on a Trimmer with the default Config when trim is set, waits
// 3 s (with a Trimmer, and until its trim is decided) and reports VmRSS
// before the burst, at its peak and then.
func burstChild(trim bool) {
	live := burst.Alloc(liveBytes)
	var tr *Trimmer
	if trim {
		var err error
		if tr, err = New(Config{}); err != nil {
			childtest.Fail("%v", err)
		}
	}
	before := childRSS()
	burst := burst.Alloc(burstBytes)
	peak := childRSS()
	runtime.KeepAlive(burst) // dropped from here on
	t0 := time.Now()
	tr.AfterBurst()
	// With a Trimmer, until its trim is decided (a loaded machine may run
	// it late), up to the max wait and a delay more; in each arm at least
	// settle.
	for s := tr.Stats(); tr != nil && s.Trims+s.Skipped == 0 && time.Since(t0) < tr.MaxWait()+tr.Delay(); s = tr.Stats() {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(time.Until(t0.Add(settle)))
	after := childRSS()
	runtime.KeepAlive(live)
	s := tr.Stats()
	if err := tr.Close(); err != nil {
		childtest.Fail("%v", err)
	}
	childtest.Say("BEFORE", before)
	childtest.Say("PEAK", peak)
	childtest.Say("AFTER", after)
	childtest.Say("TRIMS", s.Trims)
	childtest.Say("SKIPPED", s.Skipped)
	childtest.Say("RELEASED", s.TotalReleased)
	childtest.Say("ESTIMATE", s.LastEstimate)
	childtest.Say("TOOK", int64(s.LastDuration))
	childtest.Say("CHEAP", s.CHeapAllocator)
}

// TestTrimRSS runs the burst in two child processes, with and without
// AfterBurst, and compares their RSS 3 s after the burst.
func TestTrimRSS(t *testing.T) {
	t.Parallel() // child processes only
	if runtime.GOOS != "linux" {
		t.Skip("reads VmRSS from /proc: Linux only")
	}
	if raceEnabled {
		t.Skip("the race detector's shadow memory (2-3x the heap) is not returned by a trim, so RSS says nothing")
	}
	if testing.Short() {
		t.Skip("runs two 3.5 s child processes")
	}
	unset := []string{"GOGC", "GOMEMLIMIT", "GODEBUG"}
	reports := reportsAtOnce(t, childtest.Command(t, "burst-trim", unset), childtest.Command(t, "burst-notrim", unset))
	num := func(r map[string]string, k string) int64 {
		t.Helper()
		return childtest.RequireInt(t, r, k)
	}
	with, without := reports[0], reports[1]
	for _, arm := range []struct {
		name string
		r    map[string]string
	}{{"AfterBurst", with}, {"plain", without}} {
		t.Logf("%-10s RSS before %.1f MiB, peak %.1f MiB, 3 s after %.1f MiB",
			arm.name, mib(num(arm.r, "BEFORE")), mib(num(arm.r, "PEAK")), mib(num(arm.r, "AFTER")))
	}
	t.Logf("trim: %s trims, %s skipped, released %.1f MiB (estimate %.1f MiB) in %v, C heap %q",
		with["TRIMS"], with["SKIPPED"], mib(num(with, "RELEASED")), mib(num(with, "ESTIMATE")),
		time.Duration(num(with, "TOOK")), with["CHEAP"])

	assert.Greater(t, num(with, "PEAK"), num(with, "BEFORE")+200<<20, "the burst is resident at its peak")
	assert.LessOrEqual(t, num(with, "AFTER"), num(with, "BEFORE")+32<<20,
		"with AfterBurst, RSS after the trim is within 32 MiB of RSS before it")
	assert.Equal(t, int64(1), num(with, "TRIMS"))
	assert.Equal(t, int64(0), num(with, "SKIPPED"))
	assert.Greater(t, num(with, "RELEASED"), int64(200<<20))
	assert.Greater(t, num(without, "AFTER"), int64(200<<20),
		"without AfterBurst, RSS 3 s after the burst is still above 200 MiB")
}
