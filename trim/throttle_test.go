package trim

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"testing/synctest"
	"time"

	"github.com/memctl/memctl/internal/burst"
	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/internal/cpuquota"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// throttleClock is a fake CPU cgroup throttled counter that grows by share
// of the (synctest) wall time since t0, and records how it was read.
type throttleClock struct {
	t0     time.Time
	share  float64
	known  bool
	err    error // returned when known is false; default ErrNoThrottleCounter
	fresh  int   // reads that asked to find the cgroup again
	reads  int
	offset time.Duration
}

func (c *throttleClock) read(fresh bool) (time.Duration, error) {
	c.reads++
	if fresh {
		c.fresh++
	}
	if !c.known {
		return 0, cmp.Or(c.err, cgroupfs.ErrNoThrottleCounter)
	}
	return c.offset + time.Duration(c.share*float64(time.Since(c.t0))), nil
}

// trimAfterBurst runs one AfterBurst on a fake Trimmer with the throttled
// counter c and returns when the trim started after it, and the Stats.
func trimAfterBurst(t *testing.T, c *throttleClock, fixed bool, log bool) (time.Duration, Stats, *logBuf) {
	f := &fakeStep{}
	cfg := fakeConfig(f)
	cfg.throttled, cfg.FixedDelay = c.read, fixed
	var lb *logBuf
	if log {
		lb, cfg.Logger = newLog()
	}
	tr := mustNew(t, cfg)
	defer tr.Close()
	c.t0 = time.Now()
	tr.AfterBurst()
	time.Sleep(time.Minute)
	got := since(c.t0, f.starts())
	require.Len(t, got, 1)
	return got[0], tr.Stats(), lb
}

// A throttled CPU cgroup starts the trim at Delay/2 (plus at most one
// tick); an unthrottled one, an unknown counter, a share under
// throttledShare and FixedDelay keep the whole Delay.
func TestThrottledStartsAtHalfDelay(t *testing.T) {
	for _, tc := range []struct {
		name  string
		share float64
		known bool
		fixed bool
		early bool
	}{
		{"throttled 90% of one CPU", 0.9, true, false, true},
		{"throttled 1.8 CPUs (two CPUs, summed)", 1.8, true, false, true},
		{"just at throttledShare", throttledShare, true, false, true},
		{"throttled 5%", 0.05, true, false, false},
		{"not throttled", 0, true, false, false},
		{"no counter", 0.9, false, false, false},
		{"read error", 0.9, false, false, false},
		{"FixedDelay", 0.9, true, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := &throttleClock{share: tc.share, known: tc.known, offset: 5 * time.Hour}
				if tc.name == "read error" {
					c.err = errors.New("cgroupfs: open \"cpu.stat\": permission denied")
				}
				at, s, lb := trimAfterBurst(t, c, tc.fixed, true)
				t.Logf("trim at +%v, reads %d (fresh %d)", at, c.reads, c.fresh)
				if tc.early {
					assert.GreaterOrEqual(t, at, testDelay/2)
					assert.LessOrEqual(t, at, testDelay/2+2*testDelay/ticksPerDelay)
					assert.Equal(t, int64(1), s.EarlyStarts)
					assert.Equal(t, 1, lb.count("INFO", "the CPU cgroup is throttled"))
				} else {
					assertWindow(t, at, 0)
					assert.Zero(t, s.EarlyStarts)
					assert.Zero(t, lb.count("INFO", "the CPU cgroup is throttled"))
				}
				// Only an error other than "no counter" is logged, once.
				wantErrLog := 0
				if c.err != nil {
					wantErrLog = 1
				}
				assert.Equal(t, wantErrLog, lb.count("INFO", "cannot read the CPU cgroup's throttled time"))
				if tc.fixed {
					assert.Zero(t, c.reads, "FixedDelay reads no counter")
				} else {
					assert.Equal(t, 1, c.fresh, "the cgroup is found once per pending period")
					// Read from Delay/2 on, once per tick, until the trim.
					assert.LessOrEqual(t, c.reads, 1+ticksPerDelay/2+2)
				}
			})
		})
	}
}

// A call before the decision moves the quiet time; the decision at Delay/2
// after it starts the trim then. Each pending period decides again, and
// the INFO line comes once.
func TestThrottledDebounceAndNextPeriod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStep{}
		c := &throttleClock{share: 0.5, known: true}
		cfg := fakeConfig(f)
		cfg.throttled = c.read
		var lb *logBuf
		lb, cfg.Logger = newLog()
		tr := mustNew(t, cfg)
		defer tr.Close()
		c.t0 = time.Now()
		tr.AfterBurst()
		time.Sleep(testDelay / 2 * 9 / 10)
		tr.AfterBurst() // at 0.9 s: quiet from here
		time.Sleep(time.Minute)
		got := since(c.t0, f.starts())
		require.Len(t, got, 1)
		// The decision comes at 0.9 + 1.0 s, the trim Delay/2 after the last call.
		assert.GreaterOrEqual(t, got[0], testDelay/2*9/10+testDelay/2)
		assert.LessOrEqual(t, got[0], testDelay/2*9/10+testDelay/2+2*testDelay/ticksPerDelay)

		// The next period, unthrottled, waits the whole Delay.
		c.share, c.offset, c.t0 = 0, time.Duration(c.share*float64(time.Since(c.t0))), time.Now()
		t1 := time.Now()
		tr.AfterBurst()
		time.Sleep(time.Minute)
		got = since(t1, f.starts()[1:])
		require.Len(t, got, 1)
		assertWindow(t, got[0], 0)
		s := tr.Stats()
		assert.Equal(t, int64(1), s.EarlyStarts)
		assert.Equal(t, int64(2), s.Trims)
		assert.Equal(t, 2, c.fresh)
		assert.Equal(t, 1, lb.count("INFO", "the CPU cgroup is throttled"))
		// Each trim's DEBUG line shows what its charge was made of.
		assert.Equal(t, 2, lb.count("DEBUG", "trim: done"))
		for _, k := range []string{"cpu=", "gc_cpu=", "thread_cpu=", "process_cpu="} {
			assert.Contains(t, lb.String(), " "+k)
		}
	})
}

// newThrottledFake returns a Trimmer of fakeConfig(f) whose CPU cgroup is
// throttled 90% of the time from now on, and its throttled counter.
func newThrottledFake(t *testing.T, f *fakeStep) (*Trimmer, *throttleClock) {
	c := &throttleClock{share: 0.9, known: true, t0: time.Now()}
	cfg := fakeConfig(f)
	cfg.throttled = c.read
	return mustNew(t, cfg), c
}

// A trim held to the max wait by a burst in flight, or deferred by the CPU
// limit, is not an early start, though the cgroup was throttled.
func TestThrottledHeldTrimIsNotEarly(t *testing.T) {
	t.Run("burst in flight", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := &fakeStep{}
			tr, c := newThrottledFake(t, f)
			defer tr.Close()
			end := tr.Begin()
			tr.AfterBurst()
			time.Sleep(maxWaitFactor*testDelay + 5*time.Second)
			got := since(c.t0, f.starts())
			require.Len(t, got, 1)
			assert.GreaterOrEqual(t, got[0], maxWaitFactor*testDelay, "held to the max wait")
			assert.Zero(t, tr.Stats().EarlyStarts)
			end()
			time.Sleep(time.Minute)
		})
	})
	t.Run("CPU limit", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := &fakeStep{cpu: 100 * time.Millisecond}
			tr, c := newThrottledFake(t, f)
			defer tr.Close()
			_, err := tr.TrimNow() // charged 100 ms: the next trim 5 s after it
			require.NoError(t, err)
			tr.AfterBurst()
			time.Sleep(time.Minute)
			got := since(c.t0, f.starts())
			require.Len(t, got, 2)
			assert.GreaterOrEqual(t, got[1], costFactor*100*time.Millisecond, "deferred by the CPU limit")
			assert.Zero(t, tr.Stats().EarlyStarts)
		})
	})
}

// throttledChild waits for "go" on standard input (the parent moves it
// into a CPU-quota cgroup first), drops a 64 MiB burst, calls AfterBurst on
// a Trimmer with the default Config and reports when the trim started after
// it (read by the Trimmer at the start) and whether it started early.
func throttledChild() {
	childtest.Say("READY", 1)
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		childtest.Fail("stdin: %v", err)
	}
	tr, err := New(Config{})
	if err != nil {
		childtest.Fail("%v", err)
	}
	b := burst.Alloc(64 << 20)
	runtime.KeepAlive(b)
	t0 := time.Now()
	tr.AfterBurst()
	for tr.Stats().Trims == 0 && time.Since(t0) < 10*time.Second {
		time.Sleep(20 * time.Millisecond)
	}
	s := tr.Stats()
	// The start as the Trimmer read it when the trim began, on its own
	// clock: this loop, throttled with the rest of the process, may see
	// the trim's end well after it.
	tr.run.Lock()
	started := tr.lastStart
	tr.run.Unlock()
	childtest.Say("TRIMS", s.Trims)
	childtest.Say("TRIM_AFTER_S", time.Duration(started-tr.clock(t0)).Seconds())
	childtest.Say("TOOK_S", s.LastDuration.Seconds())
	childtest.Say("EARLY", s.EarlyStarts)
	_ = tr.Close()
}

// runThrottledChild runs throttledChild, inside a cgroup v1 cpu child with
// a 10% quota shared with a busy loop when quota is set.
func runThrottledChild(t *testing.T, quota bool) map[string]string {
	cmd := childtest.Command(t, "throttled", nil)
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	// A file, not a buffer: the child writes it without a goroutine of
	// ours, so it can be read at any time.
	errf, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	require.NoError(t, err)
	defer errf.Close()
	cmd.Stderr = errf
	stderr := func() string { b, _ := os.ReadFile(errf.Name()); return string(b) }
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	r := bufio.NewReader(out)
	line, err := r.ReadString('\n')
	require.NoError(t, err, stderr())
	require.Equal(t, "READY=1\n", line)
	if quota {
		g, err := cpuquota.New(fmt.Sprintf("memctl-test-trim-%d", os.Getpid()), 10000, 100000)
		require.NoError(t, err)
		defer func() { assert.NoError(t, g.Remove()) }()
		require.NoError(t, g.Add(cmd.Process.Pid))
		require.NoError(t, g.StartBusy())
	}
	_, err = in.Write([]byte("go\n"))
	require.NoError(t, err)
	rest, err := io.ReadAll(r)
	require.NoError(t, err)
	require.NoError(t, cmd.Wait(), stderr())
	return childtest.ParseReport(rest)
}

// In a real CPU-quota cgroup (cgroup v1 cpu, 10% of one CPU shared with a
// busy loop) the default Trimmer sees the throttling and starts the trim at
// half the delay; outside it, at the delay.
func TestThrottledCgroupStartsEarly(t *testing.T) {
	t.Parallel() // child processes only
	if testing.Short() {
		t.Skip("runs two children for about 2 s each")
	}
	cpuquota.SkipUnlessAvailable(t)
	rep := runThrottledChild(t, true)
	t.Logf("10%% quota and a busy loop: %v", rep)
	assert.Equal(t, "1", rep["TRIMS"])
	assert.Equal(t, "1", rep["EARLY"], "started early")
	at := childtest.RequireFloat(t, rep, "TRIM_AFTER_S")
	assert.Less(t, at, DefaultDelay.Seconds(), "the trim started before the delay")

	// The control runs in this test's own cgroup, which CI may throttle.
	self, err := cgroupfs.CPUStatFile("/proc/self/cgroup", "/proc/self/mountinfo", "")
	require.NoError(t, err)
	thr0, err := cgroupfs.ReadThrottled(self)
	require.NoError(t, err)
	t0 := time.Now()
	rep = runThrottledChild(t, false)
	thr1, err := cgroupfs.ReadThrottled(self)
	require.NoError(t, err)
	if float64(thr1-thr0) >= throttledShare*float64(time.Since(t0)) {
		t.Skipf("this test's own cgroup %s was throttled during the control (%v): no control", self, thr1-thr0)
	}
	t.Logf("no quota: %v", rep)
	assert.Equal(t, "1", rep["TRIMS"])
	assert.Equal(t, "0", rep["EARLY"])
	at = childtest.RequireFloat(t, rep, "TRIM_AFTER_S")
	assert.GreaterOrEqual(t, at, DefaultDelay.Seconds(), "no early start without throttling")
}
