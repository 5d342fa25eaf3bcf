package limits

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/internal/logattr"
)

const (
	chargedTmpfs = 300 << 20 // written to a tmpfs in the cgroup (memory.stat shmem)
	chargedAnon  = 200 << 20 // held by a neighbour process in the cgroup
	chargedCache = 300 << 20 // page cache in the cgroup: a file read once
	chargedLive  = 150 << 20 // the Go child's live heap
)

func init() {
	// charged is issue 18's case 1: it first makes the cgroup carry
	// memory it does not map (MEMCTL_TEST_MODE tmpfs: 300 MiB written to
	// a tmpfs mounted at MEMCTL_TEST_DIR, in the private mount namespace
	// the parent started it in; cache: a 300 MiB file in MEMCTL_TEST_DIR
	// written, dropped from the cache and read once; none: nothing), then
	// sets GOMEMLIMIT with the default configuration, as memctl.Start does,
	// builds a 150 MiB live heap and makes garbage for MEMCTL_TEST_CHURN.
	children["charged"] = func() {
		dir := os.Getenv("MEMCTL_TEST_DIR")
		switch mode := os.Getenv("MEMCTL_TEST_MODE"); mode {
		case "tmpfs", "ramfs":
			opts := "size=400m"
			if mode == "ramfs" {
				opts = "" // ramfs has no size limit
			}
			if err := unix.Mount("memctl-test", dir, mode, 0, opts); err != nil {
				if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
					childtest.Say("SKIP", "mount "+mode+": "+err.Error())
					return
				}
				childtest.Fail("mount %s on %s: %v", mode, dir, err)
			}
			fillFile(filepath.Join(dir, "f"), chargedTmpfs, false)
		case "cache":
			file := filepath.Join(dir, "cache")
			fillFile(file, chargedCache, true)
			f, err := os.Open(file)
			if err != nil {
				childtest.Fail("%v", err)
			}
			if _, err := io.Copy(io.Discard, f); err != nil {
				childtest.Fail("%v", err)
			}
			f.Close()
		case "none":
		default:
			childtest.Fail("unknown MEMCTL_TEST_MODE %q", mode)
		}
		l, err := cgroupfs.Of(0)
		if err != nil {
			childtest.Fail("%v", err)
		}
		if st, err := cgroupfs.ReadMemoryStat(l.Dir); err == nil {
			childtest.Say("STAT_ANON", st.Anon)
			childtest.Say("STAT_SHMEM", st.Shmem)
			childtest.Say("STAT_KEPT", st.FileUnreclaimable())
			childtest.Say("STAT_FILE_LRU", st.Reclaimable())
		}
		_, d, err := NewMemLimiter(MemLimitConfig{})
		if err != nil {
			childtest.Fail("%v", err)
		}
		// The account again, after the decision: what it may take, at most.
		if st, err := cgroupfs.ReadMemoryStat(l.Dir); err == nil {
			kmem, _ := cgroupfs.ReadKmemUsage(l.Dir)
			childtest.Say("STAT_HELD_AFTER", st.Anon+st.FileUnreclaimable()+max(kmem, st.KernelUnreclaimable(), 0))
		}
		childtest.Say("GOMEMLIMIT", debug.SetMemoryLimit(-1))
		childtest.Say("OUTSIDE", d.Outside)
		childtest.Say("CHARGED", d.Charged)
		childtest.Say("REASON", d.Reason)
		churn, err := time.ParseDuration(os.Getenv("MEMCTL_TEST_CHURN"))
		if err != nil {
			childtest.Fail("%v", err)
		}
		live := make([][]byte, chargedLive>>20)
		for i := range live {
			live[i] = touched(1 << 20)
		}
		// About 1 GB/s of garbage in 1 MiB objects, all pages written:
		// with 150 MiB live under a GOMEMLIMIT of about 163 MiB (the
		// tmpfs case) the GC runs hundreds of times a second.
		var sink []byte
		for start := time.Now(); time.Since(start) < churn; {
			sink = touched(1 << 20) // garbage
			time.Sleep(time.Millisecond)
		}
		runtime.KeepAlive(live)
		runtime.KeepAlive(sink)
		childtest.Say("GOMEMLIMIT_END", debug.SetMemoryLimit(-1))
		childtest.Say("SURVIVED", 1)
	}
	// holdAnon is the anonymous neighbour: it holds 200 MiB of touched
	// anonymous memory, says READY, and waits to be killed.
	children["holdAnon"] = func() {
		b, err := unix.Mmap(-1, 0, chargedAnon, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		if err != nil {
			childtest.Fail("%v", err)
		}
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		childtest.Say("READY", 1)
		time.Sleep(10 * time.Minute)
	}
}

// touched returns n bytes, each page written.
func touched(n int) []byte {
	b := make([]byte, n)
	for i := 0; i < n; i += 4096 {
		b[i] = 1
	}
	return b
}

// fillFile writes n bytes to file; with drop, it then syncs and drops the
// file from the page cache (posix_fadvise DONTNEED), so that a read charges
// it again to the reader's cgroup.
func fillFile(file string, n int, drop bool) {
	f, err := os.Create(file)
	if err != nil {
		childtest.Fail("%v", err)
	}
	buf := bytes.Repeat([]byte{1}, 1<<20)
	for i := 0; i < n>>20; i++ {
		if _, err := f.Write(buf); err != nil {
			childtest.Fail("%v", err)
		}
	}
	if drop {
		if err := f.Sync(); err != nil {
			childtest.Fail("%v", err)
		}
		if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
			childtest.Fail("%v", err)
		}
	}
	if err := f.Close(); err != nil {
		childtest.Fail("%v", err)
	}
}

// TestChargedByOthers is issue 18's case 1 on a real 512 MiB cgroup, four
// cgroups at once: (tmpfs) 300 MiB in a tmpfs of a private mount namespace,
// charged to the cgroup as shmem and in no process's RSS; (ramfs) the same
// in a ramfs, charged as "cache" and "unevictable", not "shmem" (missed
// before the attack on issue 18: GOMEMLIMIT 483183820); (anon) a second
// process holding 200 MiB of anonymous memory; (cache) the control, 300 MiB
// of page cache, which the kernel reclaims before it kills. Before the fix
// GOMEMLIMIT was 481007060 in all three and the first two were OOM-killed in
// their first second of churn with 150 MiB live. Now: no OOM kill in 30 s
// of churn, GOMEMLIMIT within 16 MiB of 0.9 x 512 MiB less the neighbour's
// charge, and the control's GOMEMLIMIT as without it.
func TestChargedByOthers(t *testing.T) {
	if testing.Short() {
		t.Skip("30 s of churn in four real cgroups; skipped in -short")
	}
	if raceEnabled {
		t.Skip("the race detector's shadow memory does not fit a 512 MiB cgroup test")
	}
	const limit = 512 << 20
	churn := "30s"
	cacheDir := t.TempDir()
	var fsInfo unix.Statfs_t
	require.NoError(t, unix.Statfs(cacheDir, &fsInfo))
	if fsInfo.Type == unix.TMPFS_MAGIC {
		t.Skipf("%s is a tmpfs: its files are shmem, not page cache", cacheDir)
	}

	type result struct {
		r      map[string]string
		err    error
		stderr string
		kills  int64
		before cgroupfs.MemoryStat // the cgroup before the Go child started
	}
	modes := []string{"tmpfs", "ramfs", "anon", "cache"}
	results := make(map[string]*result)
	groups := make(map[string]*cgrouptest.Group)
	for _, mode := range modes {
		groups[mode] = cgrouptest.New(t, limit)
		results[mode] = &result{}
	}
	var wg sync.WaitGroup
	for _, mode := range modes {
		g, res := groups[mode], results[mode]
		env := []string{"MEMCTL_TEST_CHURN=" + churn, "MEMCTL_TEST_MODE=" + mode}
		var neighbour *exec.Cmd
		switch mode {
		case "tmpfs", "ramfs":
			env = append(env, "MEMCTL_TEST_DIR="+t.TempDir())
		case "anon":
			env[1] = "MEMCTL_TEST_MODE=none"
			neighbour = childtest.Command(t, "holdAnon", nil)
			g.Wrap(neighbour)
			out, err := neighbour.StdoutPipe()
			require.NoError(t, err)
			require.NoError(t, neighbour.Start())
			t.Cleanup(func() { _ = neighbour.Process.Kill(); _ = neighbour.Wait() })
			sc := bufio.NewScanner(out)
			require.True(t, sc.Scan(), "the neighbour says READY")
			require.Equal(t, "READY=1", sc.Text())
			st, err := cgroupfs.ReadMemoryStat(g.Dir)
			require.NoError(t, err)
			res.before = st
		case "cache":
			env = append(env, "MEMCTL_TEST_DIR="+cacheDir)
		}
		cmd := childtest.Command(t, "charged", []string{"GOMEMLIMIT", "AUTOMEMLIMIT", "GOGC"}, env...)
		g.Wrap(cmd)
		if mode == "tmpfs" || mode == "ramfs" {
			// A private mount namespace (Go makes its mounts private), so
			// the tmpfs or ramfs lives and dies with the child.
			cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			res.err = cmd.Run()
			res.r, res.stderr = childtest.ParseReport(stdout.Bytes()), stderr.String()
			res.kills, _ = g.OOMKills()
		}()
	}
	wg.Wait()

	num := func(r map[string]string, k string) int64 { return childtest.RequireInt(t, r, k) }
	ratio := ninetyPct(limit)
	for _, mode := range modes {
		res := results[mode]
		t.Run(mode, func(t *testing.T) {
			if why := res.r["SKIP"]; why != "" || errors.Is(res.err, syscall.EPERM) {
				t.Skipf("no private mount namespace with a tmpfs or ramfs here (a container without CAP_SYS_ADMIN?): %s %v", why, res.err)
			}
			require.NoError(t, res.err, "child: %s\nstdout: %v", res.stderr, res.r)
			assert.Zero(t, res.kills, "no OOM kill in %s of churn", churn)
			assert.Equal(t, "1", res.r["SURVIVED"])
			got := num(res.r, "GOMEMLIMIT")
			var neighbour int64
			switch mode {
			case "tmpfs":
				neighbour = num(res.r, "STAT_SHMEM")
				assert.GreaterOrEqual(t, neighbour, int64(chargedTmpfs), "the tmpfs is charged as shmem")
			case "ramfs":
				// "cache" and "unevictable", not "shmem": missed before
				// (GOMEMLIMIT 483183820, OOM-killed).
				neighbour = num(res.r, "STAT_KEPT")
				assert.GreaterOrEqual(t, neighbour, int64(chargedTmpfs), "the ramfs is charged as file memory off the LRU lists")
				assert.Zero(t, num(res.r, "STAT_SHMEM"), "ramfs is not shmem")
			case "anon":
				neighbour = res.before.Anon
				assert.GreaterOrEqual(t, neighbour, int64(chargedAnon), "the neighbour is charged as anon")
			case "cache":
				assert.GreaterOrEqual(t, num(res.r, "STAT_FILE_LRU"), int64(chargedCache*9/10), "the file is in the cgroup's page cache")
			}
			want := ratio - neighbour
			assert.InDelta(t, want, got, 16<<20, "GOMEMLIMIT %d within 16 MiB of 0.9 x 512 MiB less the neighbour's %d; %s", got, neighbour, res.r["REASON"])
			if mode == "cache" {
				// What is charged is the cgroup's anon and kernel memory,
				// none of the page cache.
				assert.LessOrEqual(t, num(res.r, "CHARGED"), num(res.r, "STAT_HELD_AFTER"), "page cache is not subtracted: %s", res.r["REASON"])
			} else {
				assert.Contains(t, res.r["REASON"], "charged to the cgroup")
			}
			t.Logf("%s: GOMEMLIMIT %d (%.1f MiB; 0.9 x 512 MiB less %.1f MiB = %.1f MiB), at the end %s; %s",
				mode, got, float64(got)/(1<<20), float64(neighbour)/(1<<20), float64(want)/(1<<20), res.r["GOMEMLIMIT_END"], res.r["REASON"])
		})
	}
}

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
	cfg.deps.charge = readCharge
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
