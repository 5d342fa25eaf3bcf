package limits

import (
	"runtime/debug"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPokeAfterClose: Close stops the refresh, GOMEMLIMIT staying as it
// is: a Poke after Close (a pressure watcher the program closes after the
// limiter) re-reads nothing and changes nothing. It re-read the limit and
// set GOMEMLIMIT from it.
func TestPokeAfterClose(t *testing.T) {
	keepMemoryLimit(t)
	synctest.Test(t, func(t *testing.T) {
		l := &movingLimit{file: "/nonexistent/x/memory.max"}
		l.bytes.Store(gib)
		m, d, err := NewMemLimiter(followCfg(l, noInotify))
		require.NoError(t, err)
		require.Equal(t, ninetyPct(gib), d.GoMemLimit)
		m.Close()
		reads := l.reads.Load()
		l.bytes.Store(256 << 20)
		time.Sleep(2 * time.Second) // past Poke's once a second
		m.Poke()
		assert.Equal(t, reads, l.reads.Load(), "no re-read after Close")
		assert.Equal(t, ninetyPct(gib), debug.SetMemoryLimit(-1), "GOMEMLIMIT stays as it is")
		m.Close()
	})
}
