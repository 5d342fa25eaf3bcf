package limits

import (
	"bufio"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
)

// TestMemoryStatEACCES (attack on issue 18): a real 512 MiB v1 cgroup with
// a neighbour holding 200 MiB of anonymous memory, whose memory.stat the
// reader may not read (mode 0000, read on a thread whose file-system UID is
// nobody's, setfsuid(2), as an LSM or an unprivileged reader would see it).
// Before the fix the headroom was lost with a WARN: GOMEMLIMIT 483183820,
// 0.9 x 512 MiB, with 200 MiB charged to others. Now the cgroup's usage
// (memory.usage_in_bytes) stands in, page cache included, the WARN names
// memory.stat, and GOMEMLIMIT is at most what memory.stat would give.
func TestMemoryStatEACCES(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chmod a cgroup file and switch the file-system UID of a thread")
	}
	keepMemoryLimit(t)
	const limit = 512 << 20
	g := cgrouptest.New(t, limit)
	if g.Version != 1 {
		t.Skipf("a v1 memory cgroup is needed here, got v%d", g.Version)
	}
	neighbour := childtest.Command(t, "holdAnon", nil)
	g.Wrap(neighbour)
	out, err := neighbour.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, neighbour.Start())
	t.Cleanup(func() { _ = neighbour.Process.Kill(); _ = neighbour.Wait() })
	sc := bufio.NewScanner(out)
	require.True(t, sc.Scan(), "the neighbour says READY")
	require.Equal(t, "READY=1", sc.Text())

	limitFile := filepath.Join(g.Dir, "memory.limit_in_bytes")
	cfg := cfgFor(func() (cgroupfs.Limit, error) {
		return cgroupfs.Limit{Version: 1, Cgroup: "/x", Dir: g.Dir, Bytes: limit, File: limitFile}, nil
	})
	cfg.charge = readCharge
	decide := func(nobody bool) (MemLimit, *recorder, error) {
		rec := &recorder{}
		cfg.Logger = slog.New(rec)
		type res struct {
			d   MemLimit
			err error
		}
		c := make(chan res, 1)
		go func() {
			if nobody {
				// The thread is not unlocked: it ends with the goroutine,
				// so no other goroutine runs with its file-system UID.
				runtime.LockOSThread()
				_, _ = unix.SetfsuidRetUid(65534)
				if prev, _ := unix.SetfsuidRetUid(65534); prev != 65534 {
					c <- res{err: errors.New("setfsuid had no effect")}
					return
				}
			}
			m, d, err := NewMemLimiter(cfg)
			m.Close()
			c <- res{d, err}
		}()
		r := <-c
		return r.d, rec, r.err
	}

	// Control: memory.stat readable.
	ctl, rec, err := decide(false)
	require.NoError(t, err)
	assert.Zero(t, rec.count(slog.LevelWarn), "nothing to warn about")
	assert.GreaterOrEqual(t, ctl.Charged, int64(chargedAnon-32<<20), "the neighbour, less this test's 32 MiB of Go runtime: %s", ctl.Reason)

	stat := filepath.Join(g.Dir, "memory.stat")
	require.NoError(t, os.Chmod(stat, 0))
	t.Cleanup(func() { _ = os.Chmod(stat, 0o444) })
	d, rec, err := decide(true)
	if err != nil && err.Error() == "setfsuid had no effect" {
		t.Skip(err)
	}
	require.NoError(t, err)
	assert.Equal(t, int64(limit), d.MemoryLimit)
	assert.GreaterOrEqual(t, d.Charged, ctl.Charged-(8<<20), "the usage stands in, page cache and all: %s", d.Reason)
	assert.LessOrEqual(t, d.GoMemLimit, ctl.GoMemLimit+(8<<20))
	assert.Less(t, d.GoMemLimit, ninetyPct(limit)-(chargedAnon-32<<20)+(8<<20), "GOMEMLIMIT stays safe: %s", d.Reason)
	assert.Equal(t, d.GoMemLimit, debug.SetMemoryLimit(-1))
	assert.Contains(t, d.Reason, "memory.usage_in_bytes")
	require.Equal(t, 1, rec.count(slog.LevelWarn), "one WARN")
	var warn string
	rec.mu.Lock()
	rec.recs[0].Attrs(func(a slog.Attr) bool { warn += a.Value.String(); return true })
	rec.mu.Unlock()
	assert.Contains(t, warn, stat, "the WARN names memory.stat")
	assert.Contains(t, warn, "permission denied")
	t.Logf("control: GOMEMLIMIT %d, charged %s; memory.stat unreadable: GOMEMLIMIT %d, charged %s; WARN: %s",
		ctl.GoMemLimit, inMiB(ctl.Charged), d.GoMemLimit, inMiB(d.Charged), warn)
}
