//go:build linux

package pressure_test

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/pressure"
)

// The trigger of TestPSINoEventUnexplained: the lead's, "some 150000
// 2000000", whose 2 s window an unprivileged process may arm.
const (
	armStall  = 150 * time.Millisecond
	armWindow = 2 * time.Second
)

// psiSomeTotal returns the system-wide PSI "some" total= (µs), -1 unknown.
func psiSomeTotal() int64 {
	b, err := os.ReadFile("/proc/pressure/memory")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "some "); ok {
			for _, f := range strings.Fields(rest) {
				if v, ok := strings.CutPrefix(f, "total="); ok {
					n, err := strconv.ParseInt(v, 10, 64)
					if err == nil {
						return n
					}
				}
			}
		}
	}
	return -1
}

// childPSIStall runs READERS readers of FILE, each reading it over and
// over for DURATION_MS: in a memory cgroup far smaller than the file,
// reclaim stalls them (PSI memory "some"; one reader in a 32 MiB v1 cgroup
// stalled 5% of the time here, four 33%).
func childPSIStall() {
	until := time.Now().Add(time.Duration(envInt("DURATION_MS")) * time.Millisecond)
	var wg sync.WaitGroup
	for range envInt("READERS") {
		wg.Go(func() {
			buf := make([]byte, 1<<20)
			for time.Now().Before(until) {
				f, err := os.Open(os.Getenv("FILE"))
				if err != nil {
					childtest.Fail("%v", err)
				}
				for time.Now().Before(until) {
					if _, err := f.Read(buf); err == io.EOF {
						break
					} else if err != nil {
						childtest.Fail("%v", err)
					}
				}
				f.Close()
			}
		})
	}
	wg.Wait()
}

// childPSIArm arms the host-wide PSI trigger of a pressure.Monitor (as
// whoever runs it: the test runs it unprivileged) and watches its events
// for DURATION_MS, reporting for each the stall since arming as the PSI
// file shows it, read before Start and at the event.
func childPSIArm() {
	t0 := psiSomeTotal()
	m, err := pressure.Start(pressure.Config{Watch: "system", SpiralOff: true, Stall: armStall, StallWindow: armWindow,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		childtest.Fail("start: %v", err)
	}
	armed := time.Now()
	ch, _ := m.Subscribe(8)
	childtest.Say("READY", 1)
	timeout := time.After(time.Duration(envInt("DURATION_MS")) * time.Millisecond)
	n := 0
	for done := false; !done; {
		select {
		case e := <-ch:
			if e.Kind == pressure.KindKernel {
				childtest.Say("EVENT_"+strconv.Itoa(n), strconv.FormatInt(psiSomeTotal()-t0, 10)+"us@"+time.Since(armed).Round(time.Millisecond).String())
				n++
			}
		case <-timeout:
			done = true
		}
	}
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "Uid:") || strings.HasPrefix(l, "CapEff:") {
			k, v, _ := strings.Cut(l, ":")
			childtest.Say(strings.ToUpper(k), strings.Join(strings.Fields(v), ","))
		}
	}
	s := m.Stats()
	childtest.Say("SOURCE", s.Source)
	childtest.Say("EVENTS", n)
	childtest.Say("UNEXPLAINED", s.Unexplained)
	childtest.Say("STALL_US", psiSomeTotal()-t0)
	_ = m.Close()
}

// TestPSINoEventUnexplained (issue 32, item 5): on this project's machine
// (kernel 6.18) a PSI trigger armed just after a memory stall fired within
// 2 s with no stall since arming (0-0.8 ms against a 150 ms threshold; 8
// of 8 tries, unprivileged and as root); the lead's case was 28.6 ms. Each
// round here stalls the host's memory for 300 ms (a reader of an uncached
// 256 MiB file in a 32 MiB cgroup), then at once starts a child as uid
// 65534 (an unprivileged trigger: no CAP_SYS_RESOURCE) that arms the
// host-wide trigger and watches for 2 s. No event may be delivered whose
// stall since arming, in the PSI file, is under the threshold; the events
// ignored are counted in Stats.Unexplained.
func TestPSINoEventUnexplained(t *testing.T) {
	if testing.Short() {
		t.Skip("two 2 s rounds and a 5 s control")
	}
	if raceEnabled {
		t.Skip("the stall's reader is OOM-killed in its 32 MiB cgroup under the race detector (its shadow memory); the watcher's goroutine is raced in the other tests")
	}
	if psiSomeTotal() < 0 {
		t.Skip("no PSI here: /proc/pressure/memory cannot be read (CONFIG_PSI off or psi=0)")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: to run the child as uid 65534 and to make a memory cgroup for the stall")
	}
	g := cgrouptest.New(t, 32<<20)
	file := writeUncached(t, t.TempDir(), 256<<20)
	exe := unprivilegedCopy(t)
	stall := func(ms, readers int) {
		cmd := childtest.Command(t, "psistall", nil, "FILE="+file, "DURATION_MS="+strconv.Itoa(ms), "READERS="+strconv.Itoa(readers))
		g.Wrap(cmd)
		var serr bytes.Buffer
		cmd.Stderr = &serr
		require.NoError(t, cmd.Run(), serr.String())
	}
	arm := func(ms int) *exec.Cmd {
		cmd := childtest.Command(t, "psiarm", nil, "DURATION_MS="+strconv.Itoa(ms))
		cmd.Path, cmd.Args[0], cmd.Dir = exe, exe, filepath.Dir(exe)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
		return cmd
	}
	var events, unexplained int
	check := func(round string, rep map[string]string) {
		t.Logf("%s: %v", round, rep)
		require.Contains(t, rep["SOURCE"], "/proc/pressure/memory")
		require.True(t, strings.HasPrefix(rep["UID"], "65534,"), "the child runs as uid 65534: %q", rep["UID"])
		require.Equal(t, "0000000000000000", rep["CAPEFF"], "the child has no capability")
		for k, v := range rep {
			if !strings.HasPrefix(k, "EVENT_") {
				continue
			}
			us, _, _ := strings.Cut(v, "us@")
			since, err := strconv.ParseInt(us, 10, 64)
			require.NoError(t, err, v)
			assert.GreaterOrEqual(t, since, armStall.Microseconds(),
				"%s: an event delivered with %d us of stall since arming, under the %v threshold (%s)", round, since, armStall, v)
		}
		n, _ := strconv.Atoi(rep["EVENTS"])
		u, _ := strconv.Atoi(rep["UNEXPLAINED"])
		events, unexplained = events+n, unexplained+u
	}
	// The stall just before arming.
	for round := range 2 {
		stall(300, 1)
		cmd := arm(2000) // the false events came 0.1-1.7 s after arming
		var out, aerr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &aerr
		require.NoError(t, cmd.Run(), aerr.String())
		check(fmt.Sprintf("stall before arming, round %d", round), childtest.ParseReport(out.Bytes()))
	}
	t.Logf("events delivered %d, ignored as unexplained by the stall since arming %d", events, unexplained)
	// The control: a stall after arming is still delivered when it is
	// well over the threshold (600 ms of stall over 2 s holds at least
	// 150 ms in some 2 s window), also when a false event came first: the
	// kernel then sends nothing for a window, and the event ignored is
	// looked at again a window later. The stall before arming makes that
	// false event likely; the watch lasts two windows and a second.
	stall(300, 1)
	a := startArm(t, arm(5000))
	<-a.ready
	stall(2000, 4)
	rep := a.wait(t)
	check("stall after arming", rep)
	if since, _ := strconv.ParseInt(rep["STALL_US"], 10, 64); since >= 4*armStall.Microseconds() {
		assert.NotEqual(t, "0", rep["EVENTS"], "%d us of stall since arming and no event delivered", since)
	} else {
		t.Logf("stall after arming only %d us: too little to require an event", since)
	}
}

// unprivilegedCopy copies the test binary into a directory that uid 65534
// can enter and returns its path (go test's own build directory is 0700).
func unprivilegedCopy(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	dir, err := os.MkdirTemp("", "memctl-psiarm-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	b, err := os.ReadFile(self)
	require.NoError(t, err)
	exe := filepath.Join(dir, "pressure.test")
	require.NoError(t, os.WriteFile(exe, b, 0o755))
	return exe
}
