package limits

import (
	"bufio"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/internal/logattr"
)

// TestMemoryStatEACCES (attack on issue 18): a real 512 MiB v1 cgroup with
// a neighbour holding 200 MiB of anonymous memory, whose memory.stat the
// reader may not read (mode 0000, read on a thread whose file-system UID is
// nobody's, setfsuid(2), as an LSM or an unprivileged reader would see it).
// Before the fix the headroom was lost with a WARN: GOMEMLIMIT 483183820,
// 0.9 x 512 MiB, with 200 MiB charged to others. Now the cgroup's usage
// (memory.usage_in_bytes) stands in, page cache included, the WARN names
// memory.stat, and GOMEMLIMIT is at most what memory.stat would give. The
// limit is read as Start reads it: before the fix the unreadable
// memory.stat (for hierarchical_memory_limit) failed the whole read too,
// and GOMEMLIMIT was left unset.
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

	// The limit is read as Start reads it (cgroupfs.Read of the real
	// mountinfo and cgroup files), for a /proc/self/cgroup that puts this
	// process in the test's cgroup, in a directory nobody may read.
	self, err := cgroupfs.Of(0)
	require.NoError(t, err)
	mountPoint, ok := strings.CutSuffix(self.Dir, self.Cgroup)
	require.True(t, ok, "%s under %s", self.Cgroup, self.Dir)
	rel, ok := strings.CutPrefix(g.Dir, mountPoint)
	require.True(t, ok, "%s under %s", g.Dir, mountPoint)
	tmp := t.TempDir()
	for d := tmp; d != filepath.Dir(d) && d != os.TempDir(); d = filepath.Dir(d) {
		require.NoError(t, os.Chmod(d, 0o755))
	}
	cgroupFile := filepath.Join(tmp, "cgroup")
	require.NoError(t, os.WriteFile(cgroupFile, []byte("4:memory:"+rel+"\n"), 0o644))
	cfg := cfgFor(func() (cgroupfs.Limit, error) { return cgroupfs.Read(cgroupFile, "/proc/self/mountinfo", "") })
	cfg.cgroupFile = cgroupFile
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
	// Two WARNs, each naming memory.stat: hierarchical_memory_limit not
	// read (memory.limit_in_bytes still is), and the account.
	warn := rec.text()
	require.Equal(t, 2, rec.count(slog.LevelWarn), "%s", warn)
	assert.Contains(t, warn, "hierarchical_memory_limit not read")
	assert.Contains(t, warn, "its usage")
	assert.Equal(t, 2, strings.Count(warn, stat), "each WARN names memory.stat: %s", warn)
	assert.Contains(t, warn, "permission denied")
	t.Logf("control: GOMEMLIMIT %d, charged %s; memory.stat unreadable: GOMEMLIMIT %d, charged %s; WARN: %s",
		ctl.GoMemLimit, logattr.MiB(ctl.Charged), d.GoMemLimit, logattr.MiB(d.Charged), warn)
}
