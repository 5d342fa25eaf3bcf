//go:build linux

package pressure_test

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/internal/procfs"
)

const mib = 1 << 20

func TestMain(m *testing.M) {
	childtest.Main(m, map[string]func(){
		"spiral": childSpiral,
		"idle":   childIdle,
		"plain":  childPlain,
		"v1trim": childV1Trim,
		"thrash": childThrash,
		// issue 17 (makeup_linux_test.go, choose_linux_test.go)
		"pointerheap": childPointerHeap,
		"reader":      childReader,
		"streamer":    childStreamer,
		"owngarbage":  childOwnGarbage,
		"armed":       childArmed,
		"rocgroup":    childReadOnlyCgroup,
		// watch_linux_test.go (issue 32, item 5)
		"psistall": childPSIStall,
		"psiarm":   childPSIArm,
	})
}

func envInt(key string) int {
	n, err := strconv.Atoi(os.Getenv(key))
	if err != nil {
		childtest.Fail("%s: %v", key, err)
	}
	return n
}

// obj is a live-heap object with pointers to scan: a death spiral is
// costly because each cycle marks the whole live heap again. 1 KiB.
type obj struct {
	_ [16]*obj
	_ [1024 - 16*8]byte
}

// fillPageCache writes a file of up to max bytes in 4 MiB chunks under
// dir, over and over, until stop returns true, reading each chunk back
// (a refault stalls when the cgroup reclaimed it). It returns whether stop
// returned true.
func fillPageCache(dir string, max int64, stop func() bool, until time.Time) bool {
	f, err := os.CreateTemp(dir, "memctl-i12-cache-")
	if err != nil {
		childtest.Fail("%v", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 4*mib)
	for i := range buf {
		buf[i] = byte(i)
	}
	for off := int64(0); time.Now().Before(until); off = (off + int64(len(buf))) % max {
		if _, err := f.WriteAt(buf, off); err != nil {
			childtest.Fail("%v", err)
		}
		if _, err := f.ReadAt(buf, (off*7)%max); err != nil && err != io.EOF {
			childtest.Fail("%v", err)
		}
		if stop() {
			return true
		}
	}
	return false
}

func rss() int64 {
	n, err := procfs.RSS(0)
	if err != nil {
		childtest.Fail("%v", err)
	}
	return n
}

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

// childReader (case 1's neighbour): READERS goroutines read FILE over
// and over for DURATION_S, in its own small cgroup.
func childReader() {
	until := time.Now().Add(time.Duration(envInt("DURATION_S")) * time.Second)
	childtest.Say("READY", 1)
	var wg sync.WaitGroup
	for range envInt("READERS") {
		wg.Go(func() {
			buf := make([]byte, 1<<20)
			for time.Now().Before(until) {
				f, err := os.Open(os.Getenv("FILE"))
				if err != nil {
					childtest.Fail("%v", err)
				}
				_, _ = io.CopyBuffer(io.Discard, f, buf)
				f.Close()
			}
		})
	}
	wg.Wait()
}

// neighbour starts the page-cache reader of case 1 in its own 64 MiB v1
// cgroup: readers of a 512 MiB file; three held system PSI "some"
// (avg10) at 13-25% on this repository's test machine, the 10-16%
// (one reader gave 3-4% here, two 6-15%).
func neighbour(t *testing.T, secs, readers int) *armChild {
	t.Helper()
	file := writeUncached(t, t.TempDir(), 512<<20)
	reader := childtest.Command(t, "reader", nil, "FILE="+file, "READERS="+strconv.Itoa(readers), "DURATION_S="+strconv.Itoa(secs))
	newGroup(t, 64<<20).Wrap(reader)
	return startArm(t, reader)
}

// armArm is one child of a scenario, run at the same time as the others:
// its KEY=VALUE lines, read until it exits.
type armChild struct {
	cmd   *exec.Cmd
	ready chan struct{}
	mu    sync.Mutex
	rep   map[string]string
	done  chan struct{}
	err   error
}

// startArm starts cmd and collects its report; ready closes at its READY
// line.
func startArm(t *testing.T, cmd *exec.Cmd) *armChild {
	t.Helper()
	a := &armChild{cmd: cmd, ready: make(chan struct{}), rep: map[string]string{}, done: make(chan struct{})}
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-a.done })
	go func() {
		defer close(a.done)
		sc := bufio.NewScanner(out)
		readied := false
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), "="); ok {
				a.mu.Lock()
				a.rep[k] = v
				a.mu.Unlock()
				if k == "READY" && !readied {
					readied = true
					close(a.ready)
				}
			}
		}
		if err := cmd.Wait(); err != nil {
			a.err = fmt.Errorf("%v: %w\nstderr:\n%s", cmd.Args, err, stderr.String())
		}
		if !readied {
			close(a.ready)
		}
	}()
	return a
}

// wait waits for the child to exit and returns its report.
func (a *armChild) wait(t *testing.T) map[string]string {
	t.Helper()
	<-a.done
	require.NoError(t, a.err)
	return a.rep
}

// newGroup makes a v1/v2 memory cgroup with limit bytes, named for this
// issue and process, removed at the end of the test.
func newGroup(t *testing.T, limit int64) *cgrouptest.Child {
	t.Helper()
	parent, err := cgrouptest.WritableParent()
	if err != nil {
		t.Skipf("no writable memory cgroup: %v", err)
	}
	c, err := parent.NewChild(fmt.Sprintf("memctl-i17-%d-%d", os.Getpid(), time.Now().UnixNano()), limit)
	if err != nil {
		t.Skipf("%v", err)
	}
	t.Cleanup(func() {
		if err := c.Remove(); err != nil {
			t.Errorf("%v", err)
		}
	})
	return c
}

// writeUncached writes a file of n bytes under dir and drops it from the
// page cache (fsync, POSIX_FADV_DONTNEED), so that its readers' cgroups,
// not the test's, are charged for its pages.
func writeUncached(t *testing.T, dir string, n int64) string {
	t.Helper()
	f, err := os.CreateTemp(dir, "memctl-i17-")
	require.NoError(t, err)
	defer f.Close()
	buf := make([]byte, 4<<20)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	for off := int64(0); off < n; off += int64(len(buf)) {
		_, err := f.Write(buf)
		require.NoError(t, err)
	}
	require.NoError(t, f.Sync())
	require.NoError(t, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED))
	return f.Name()
}

// memctlUnset are the variables a scenario's child must not inherit.
var memctlUnset = []string{"MEMCTL", "MEMCTL_PRESSURE", "GOMEMLIMIT", "AUTOMEMLIMIT", "MEMCTL_TRIM_DELAY", "GOGC",
	"MEMORY_PRESSURE_WATCH", "MEMORY_PRESSURE_WRITE"}

func num(t *testing.T, rep map[string]string, key string) float64 {
	t.Helper()
	v, ok := rep[key]
	require.True(t, ok, "no %s in %v", key, rep)
	f, err := strconv.ParseFloat(v, 64)
	require.NoError(t, err, key)
	return f
}

// requireSignals requires signals where the host's PSI "some" stall since
// stall0 (psiSomeTotal), over d, says the default trigger (200 ms in 2 s,
// a tenth of the time) must have fired: a stall of at least a tenth of d
// holds a tenth of some 2 s window. A neighbour that a loaded machine let
// stall less than that skips the test, saying so.
func requireSignals(t *testing.T, signals float64, stall0 int64, d time.Duration, msg string) {
	t.Helper()
	if signals > 0 {
		return
	}
	stall := time.Duration(psiSomeTotal()-stall0) * time.Microsecond
	if stall0 < 0 || stall < d/10 {
		t.Skipf("no signal, and the host's memory stall over %v was %v, under the trigger's tenth: the neighbour made too little pressure here to require one", d.Round(time.Second), stall)
	}
	require.Positive(t, signals, "%s (host stall %v over %v)", msg, stall, d.Round(time.Second))
}
