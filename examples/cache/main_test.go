package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
)

func TestMain(m *testing.M) {
	childtest.Main(m, map[string]func(){"cache": main})
}

// followBound is how long the limiter may take to follow a written limit:
// at once where the write is seen, at the latest the refresh interval
// (10 s) at a GC end, which this allocating example runs.
const followBound = 10 * time.Second

// TestCacheFollowsResize (issue 32 item 3): in a 512 MiB cgroup resized to
// 256 MiB, the cache holds at most its share of the new GOMEMLIMIT within
// the limiter's bound.
func TestCacheFollowsResize(t *testing.T) {
	g := cgrouptest.New(t, 512<<20)
	cmd := childtest.Command(t, "cache", []string{"MEMCTL", "GOMEMLIMIT", "AUTOMEMLIMIT", "MEMCTL_REFRESH"})
	g.Wrap(cmd)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	type line struct{ held, max, gml int64 }
	lines := make(chan line, 1024)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var l line
			if _, err := fmt.Sscanf(sc.Text(), "CACHE=%d MAX=%d GOMEMLIMIT=%d", &l.held, &l.max, &l.gml); err == nil {
				lines <- l
			}
		}
	}()
	// Full at the first limit.
	var l line
	for deadline := time.Now().Add(30 * time.Second); l.max == 0 || l.held+(1<<20) < l.max; {
		select {
		case x, ok := <-lines:
			require.True(t, ok, "the example reports")
			l = x
		case <-time.After(time.Until(deadline)):
			t.Fatalf("the cache did not fill: %+v", l)
		}
	}
	assert.InEpsilon(t, 0.25*float64(l.gml), float64(l.max), 0.01, "a quarter of GOMEMLIMIT")
	assert.Greater(t, l.gml, int64(400<<20), "GOMEMLIMIT from the 512 MiB limit")

	file := "memory.limit_in_bytes"
	if g.Version == 2 {
		file = "memory.max"
	}
	require.NoError(t, os.WriteFile(filepath.Join(g.Dir, file), []byte(strconv.Itoa(256<<20)), 0))
	written := time.Now()
	for {
		select {
		case x, ok := <-lines:
			require.True(t, ok, "the example still reports")
			if x.gml < 256<<20 && x.held <= int64(0.25*float64(x.gml)) {
				t.Logf("%v after the write: GOMEMLIMIT %d -> %d, cache %d -> %d bytes (max %d)",
					time.Since(written), l.gml, x.gml, l.held, x.held, x.max)
				return
			}
		case <-time.After(time.Until(written.Add(followBound))):
			t.Fatalf("the cache did not shrink to a quarter of the new GOMEMLIMIT within %v", followBound)
		}
	}
}
