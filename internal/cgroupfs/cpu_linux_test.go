package cgroupfs

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memctl/memctl/internal/cpuquota"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// In a real cgroup v1 cpu child with a 10% quota and a busy loop inside,
// CPUStatFile names the child's cpu.stat for the busy loop, and its
// throttled time grows with the periods the kernel counted as throttled.
func TestReadThrottledReal(t *testing.T) {
	cpuquota.SkipUnlessAvailable(t)
	self, err := CPUStatFile("/proc/self/cgroup", "/proc/self/mountinfo", "")
	require.NoError(t, err)
	self0, err := ReadThrottled(self)
	require.NoError(t, err)

	g, err := cpuquota.New(fmt.Sprintf("memctl-test-cgroupfs-%d", os.Getpid()), 10000, 100000)
	require.NoError(t, err)
	defer func() { assert.NoError(t, g.Remove()) }()
	require.NoError(t, g.StartBusy())
	pid := g.BusyPid()
	proc := "/proc/" + strconv.Itoa(pid)
	file, err := CPUStatFile(proc+"/cgroup", proc+"/mountinfo", "")
	require.NoError(t, err)
	// The same file, whatever the name: on many v1 hosts /sys/fs/cgroup/cpu
	// is a symlink to the cpu,cpuacct mount that mountinfo names.
	want, err := os.Stat(filepath.Join(g.Dir, "cpu.stat"))
	require.NoError(t, err)
	got, err := os.Stat(file)
	require.NoError(t, err, file)
	assert.True(t, os.SameFile(want, got), "%s is %s", file, filepath.Join(g.Dir, "cpu.stat"))

	// The kernel's own count of throttled periods (nr_throttled), read
	// around the two readings, is the control: the busy loop is throttled
	// in a period only when it used its whole quota in it, which a loaded
	// machine may not give it.
	n0 := nrThrottled(t, file)
	d0, err := ReadThrottled(file)
	require.NoError(t, err)
	const wall = 500 * time.Millisecond
	time.Sleep(wall)
	d1, err := ReadThrottled(file)
	require.NoError(t, err)
	n1 := nrThrottled(t, file)
	self1, err := ReadThrottled(self)
	require.NoError(t, err)
	t.Logf("throttled over %v: quota cgroup %v in %d throttled periods, own cgroup %v (%s)", wall, d1-d0, n1-n0, self1-self0, self)
	// The test's own cgroup is read for comparison only: CI may run it
	// under a quota of its own.
	if n1-n0 < 3 {
		t.Skipf("the busy loop was throttled in %d periods of 100 ms over %v (nr_throttled): the machine did not give it its 10%% quota, so there was little or no throttled time to read (%v read)", n1-n0, wall, d1-d0)
	}
	// A throttled period that began and ended between the readings (one
	// does when three were counted around them) adds to throttled_time;
	// each adds at most its period on each CPU, and one in flight at the
	// first reading may add its part too.
	assert.Positive(t, d1-d0, "throttled time grew over %d throttled periods", n1-n0)
	assert.LessOrEqual(t, d1-d0, time.Duration(n1-n0+1)*100*time.Millisecond*time.Duration(runtime.NumCPU()))
}

// nrThrottled returns nr_throttled, the throttled periods counted in the
// cgroup v1 cpu.stat file.
func nrThrottled(t *testing.T, file string) int64 {
	t.Helper()
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "nr_throttled "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(t, err, line)
			return n
		}
	}
	t.Fatalf("no nr_throttled in %s: %q", file, b)
	return 0
}
