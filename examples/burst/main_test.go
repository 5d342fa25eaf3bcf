package main

import (
	"bytes"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) {
	if os.Getenv(armEnv) != "" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestDemo runs the demo as `go run ./examples/burst` does, reading each
// child's RSS from /proc, and checks the effect it claims.
func TestDemo(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's shadow memory keeps RSS high after a trim; run without -race")
	}
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("needs /proc")
	}
	arms, err := run()
	require.NoError(t, err)
	var out bytes.Buffer
	printTable(&out, arms)
	t.Log("\n" + out.String())
	plain, mc := arms[0], arms[1]
	assert.Greater(t, plain.peak, int64(burstBytes), "the burst was resident")
	assert.Greater(t, mc.peak, int64(burstBytes), "the burst was resident")
	// Issue 13 input 8: the rows are read clear of the trim, so each says
	// the same on every run.
	assert.Greater(t, mc.at(rowsAt[0]), int64(burstBytes*3/4), "memctl arm still holds the burst 1 s after: the trim runs at 2 s")
	assert.Less(t, mc.trimmed, mc.before+32<<20, "memctl arm is back within 32 MiB right after its trim")
	assert.Less(t, mc.at(rowsAt[1]), mc.before+32<<20, "memctl arm is back within 32 MiB 4 s after the burst")
	assert.Greater(t, plain.at(rowsAt[1]), int64(burstBytes*3/4), "plain arm still holds the burst 4 s after")
	assert.Equal(t, int64(-1), plain.trimmed)
	// One trim for the burst; the kernel pressure watcher may add one when
	// other processes push the machine into memory pressure (system PSI).
	assert.Regexp(t, `^[1-9][0-9]* trim\(s\) run`, mc.stats)
	assert.Contains(t, out.String(), "memctl started")
}
