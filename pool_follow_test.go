package memctl

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/limits"
)

func init() { moreChildren["pool-resize"] = childPoolResize }

// childPoolResize runs Start and a pool with defaults, as a service does,
// and reports GOMEMLIMIT and the pool's limit every 20 ms while it
// allocates garbage (so that GC cycles end).
func childPoolResize() {
	ctl, err := Start()
	if err != nil {
		childtest.Fail("%v", err)
	}
	defer ctl.Close()
	p, err := limits.NewPool(limits.PoolConfig{})
	if err != nil {
		childtest.Fail("%v", err)
	}
	defer p.Close()
	live := make([][]byte, 32)
	for i := range live {
		live[i] = make([]byte, 1<<20)
	}
	last := time.Now()
	for i := 0; ; i++ {
		live[i%len(live)] = make([]byte, 1<<20)
		if i%16 == 0 {
			time.Sleep(time.Millisecond)
		}
		if time.Since(last) > 20*time.Millisecond {
			// Reported only when no refresh came between the two reads.
			if g, l := debug.SetMemoryLimit(-1), p.Stats().Limit; g == debug.SetMemoryLimit(-1) {
				fmt.Printf("GOMEMLIMIT=%d POOL=%d\n", g, l)
			}
			last = time.Now()
		}
	}
}

// Input (issue 27, items 4 and 6; OpenTelemetry Collector #15580): a real
// v1 cgroup lowered from 256 to 128 MiB; GOMEMLIMIT followed and the
// default pool stayed at 113.8 MiB, all of the new GOMEMLIMIT. The pool
// made with defaults now logs its limit and where it came from, and
// follows GOMEMLIMIT: in the report where GOMEMLIMIT first shows the new
// limit, the pool's limit is already half of it (DefaultPoolRatio).
// MEMCTL_REFRESH=1s keeps the test short (the default is 10 s).
func TestPoolFollowsResizeInCgroup(t *testing.T) {
	g := cgrouptest.New(t, 256<<20)
	cmd := childtest.Command(t, "pool-resize", []string{"MEMCTL", "GOMEMLIMIT", "AUTOMEMLIMIT", "MEMCTL_GOMEMLIMIT_FLOOR", "MEMCTL_BUDGETS"}, "MEMCTL_REFRESH=1s")
	g.Wrap(cmd)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr syncBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	type report struct{ gml, pool int64 }
	lines := make(chan report, 4096)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var r report
			if _, err := fmt.Sscanf(sc.Text(), "GOMEMLIMIT=%d POOL=%d", &r.gml, &r.pool); err == nil {
				lines <- r
			}
		}
	}()
	next := func(within time.Duration) (report, bool) {
		select {
		case r, ok := <-lines:
			return r, ok
		case <-time.After(within):
			return report{}, false
		}
	}
	first, ok := next(10 * time.Second)
	require.True(t, ok, "the child reports; stderr: %s", stderr.String())
	assert.Greater(t, first.gml, int64(200<<20), "0.9 of 256 MiB less a few MiB")
	assert.Equal(t, first.gml/2, first.pool, "half of GOMEMLIMIT")
	// The report is on stdout, the log on stderr: wait for the line.
	made := stderr.waitLine(t, "limits: pool made", 10*time.Second)
	t.Logf("%s", made)
	assert.Contains(t, made, fmt.Sprintf("limit=%.1fMiB ", float64(first.pool)/(1<<20)))
	assert.Contains(t, made, "limit_source=\"half of GOMEMLIMIT")

	file := "memory.limit_in_bytes"
	if g.Version == 2 {
		file = "memory.max"
	}
	require.NoError(t, os.WriteFile(filepath.Join(g.Dir, file), []byte(strconv.Itoa(128<<20)), 0))
	lowered := time.Now()
	r := first
	for r.gml > 128<<20 {
		r, ok = next(20 * time.Second)
		require.True(t, ok, "the child still reports; last %+v; stderr: %s", r, stderr.String())
	}
	took := time.Since(lowered)
	t.Logf("GOMEMLIMIT %d -> %d, pool %d -> %d, %v after the limit was lowered", first.gml, r.gml, first.pool, r.pool, took)
	assert.Equal(t, r.gml/2, r.pool, "the pool follows in the same refresh")
	stderr.waitLine(t, "limits: pool limit follows GOMEMLIMIT", 10*time.Second)
}

// syncBuffer is a bytes.Buffer safe for the writer (the child's stderr
// copier) and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// waitLine waits up to within for a line holding sub and returns the last
// such line; it fails the test, showing what arrived, if none does.
func (s *syncBuffer) waitLine(t *testing.T, sub string, within time.Duration) string {
	t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(10 * time.Millisecond) {
		line := ""
		for _, l := range strings.Split(s.String(), "\n") {
			if strings.Contains(l, sub) {
				line = l
			}
		}
		if line != "" {
			return line
		}
		if time.Now().After(deadline) {
			t.Fatalf("no line with %q on stderr within %v; stderr:\n%s", sub, within, s.String())
		}
	}
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
