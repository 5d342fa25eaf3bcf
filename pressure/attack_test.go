//go:build linux

package pressure_test

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/memsignal"
	"github.com/memctl/memctl/pressure"
)

// syncBuf is a bytes.Buffer safe for the watcher's goroutine and the test.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// warnedOr returns the log, or, where no other source could be watched
// (Start then returns the error and logs nothing: the facade logs it at
// WARN), the error as that WARN would say it.
func warnedOr(logs string, err error) string {
	if err != nil {
		return "level=WARN " + err.Error()
	}
	return logs
}

// Attack input (issue 17): the memory.stat of the watched cgroup cannot be
// read (EACCES), at every signal. Before, an unknown makeup was taken as
// anonymous: each signal also cancelled the largest request, on data that
// could not be read, and the error rode on the WARN of every stretch of
// pressure. Now the trim is still asked for (its gate decides), the cancel
// is held (Stats.CancelsHeld), and one WARN names the file.
func TestUnreadableMakeupHoldsCancel(t *testing.T) {
	defer goleak.VerifyNone(t)
	fifo := filepath.Join(t.TempDir(), "memory-pressure")
	require.NoError(t, unix.Mkfifo(fifo, 0o600))
	t.Setenv("MEMORY_PRESSURE_WATCH", fifo)
	t.Setenv("MEMORY_PRESSURE_WRITE", "")
	const file = "/sys/fs/cgroup/memory/app/memory.stat"
	var bad atomic.Bool
	bad.Store(true)
	makeup := func() (pressure.Makeup, error) {
		if bad.Load() {
			return pressure.Makeup{Anon: -1, Cache: -1, From: file},
				fmt.Errorf("cgroupfs: open %s: %w", file, fs.ErrPermission)
		}
		return pressure.AnonMakeup()
	}
	var trims, cancels atomic.Int64
	var logs syncBuf
	m, err := pressure.StartWith(pressure.Config{Watch: "systemd", SpiralOff: true,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), MinInterval: 100 * time.Millisecond},
		pressure.Fakes{Trim: func() { trims.Add(1) }, Cancel: func() { cancels.Add(1) }, Makeup: makeup})
	require.NoError(t, err)
	defer m.Close()
	ch, _ := m.Subscribe(16)
	w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	require.NoError(t, err)
	defer w.Close()
	signal := func() pressure.Event {
		_, err := w.Write([]byte("x"))
		require.NoError(t, err)
		return waitKernel(t, ch, 10*time.Second)
	}
	const n = 4
	for i := range n {
		e := signal()
		assert.False(t, memsignal.Makeup(e.Makeup).Known(), "signal %d: unknown makeup", i)
	}
	s := m.Stats()
	assert.Equal(t, int64(n), trims.Load(), "the trim is asked for: its gate decides")
	assert.Zero(t, cancels.Load(), "no request is cancelled on data that could not be read")
	assert.Equal(t, int64(n), s.CancelsHeld)
	assert.Zero(t, s.LeftToKernel, "unknown is not page cache either")
	out := logs.String()
	assert.Equal(t, 1, strings.Count(out, "cannot tell what the memory under pressure is made of"), "one WARN, not one per signal:\n%s", out)
	assert.Equal(t, 1, strings.Count(out, "permission denied"), "the error is said once:\n%s", out)
	assert.Contains(t, out, "file="+file, "the WARN names the file")

	// Readable again: the cancel follows the makeup; unreadable again: one
	// more WARN.
	bad.Store(false)
	signal()
	assert.Equal(t, int64(1), cancels.Load())
	bad.Store(true)
	signal()
	assert.Equal(t, int64(1), cancels.Load())
	assert.Equal(t, 2, strings.Count(logs.String(), "cannot tell what the memory under pressure is made of"))
	require.NoError(t, m.Close())
}

// Attack inputs (issue 17): hostile memory.stat files. Each gives either a
// makeup the decision can trust or an unknown one, never a wrong
// "anonymous" (which would cancel a request).
func TestHostileMemoryStat(t *testing.T) {
	for _, tc := range []struct {
		name, stat string
		known      bool // parsed and complete
		anonymous  bool
	}{
		{"no inactive_file line: the cache would be understated", "rss 209715200\nactive_file 1048576\n", false, false},
		{"no file lines at all", "anon 209715200\nfile 1000\n", false, false},
		{"file lists that overflow int64 when summed", "anon 209715200\nactive_file 9223372036854775807\ninactive_file 1\n", true, false},
		{"v1 hierarchical total_ lines win over own", "rss 300000000\nactive_file 1\ninactive_file 1\ntotal_rss 1048576\ntotal_active_file 104857600\ntotal_inactive_file 104857600\n", true, false},
		{"v1 total_ lines only", "total_rss 209715200\ntotal_active_file 1048576\ntotal_inactive_file 1048576\n", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := cgroupfs.ParseMemoryStat(strings.NewReader(tc.stat), "memory.stat")
			require.NoError(t, err)
			mk := memsignal.MakeupOfStat(s, "memory.stat")
			assert.Equal(t, tc.known, mk.Known(), "%+v", mk)
			assert.Equal(t, tc.anonymous, mk.Anonymous(), "%+v", mk)
			assert.GreaterOrEqual(t, mk.Cache, int64(-1), "never a wrapped sum")
		})
	}
	// Malformed files are errors naming the file (the watcher then holds
	// the cancel, TestUnreadableMakeupHoldsCancel).
	for _, bad := range []string{
		"anon 1\nanon 2\nactive_file 1\ninactive_file 1\n", // duplicated
		"anon -5\nactive_file 1\ninactive_file 1\n",        // negative
		"anon 99999999999999999999\nactive_file 1\n",       // overflowing
		"anon lots\nactive_file 1\n",                       // not numeric
		"anon 5\nrss 5\nactive_file 1\ninactive_file 1\n",  // v1 and v2 mixed
		"total_anon 5\nactive_file 1\ninactive_file 1\n",   // no anon nor rss
		"anon 5\nactive_file 1\ninactive_file 1 extra\n",   // trailing field
	} {
		_, err := cgroupfs.ParseMemoryStat(strings.NewReader(bad), "/x/memory.stat")
		require.Error(t, err, "%q", bad)
		assert.Contains(t, err.Error(), "/x/memory.stat", "%q", bad)
	}
	// /proc/meminfo whose file lists overflow when summed.
	dir := t.TempDir()
	mi := filepath.Join(dir, "meminfo")
	require.NoError(t, os.WriteFile(mi, []byte("AnonPages: 1024 kB\nActive(file): 9007199254740991 kB\nInactive(file): 9007199254740991 kB\n"), 0o600))
	mk, err := memsignal.HostMakeup(mi, "")
	require.NoError(t, err)
	assert.True(t, mk.Known())
	assert.False(t, mk.Anonymous(), "saturated, not wrapped: %+v", mk)
	require.NoError(t, os.WriteFile(mi, []byte("AnonPages: 1024 kB\nActive(file): 5 kB\n"), 0o600))
	mk, err = memsignal.HostMakeup(mi, "")
	require.Error(t, err)
	assert.False(t, mk.Known())
	assert.Equal(t, mi, mk.From, "the unknown makeup names the file")
}

// Attack inputs (issue 17): $MEMORY_PRESSURE_WATCH naming something that
// is not a PSI file, a FIFO or a socket. Before, a regular file on disk or
// a character device was opened read-write, the trigger written into it (a
// regular file was overwritten) and polled for POLLPRI, which such files
// never signal: systemd's source in use, no WARN, no signal ever. Now each
// is a WARN naming the variable, the watcher falls back, and nothing is
// written.
func TestSystemdWatchNotPSI(t *testing.T) {
	defer goleak.VerifyNone(t)
	dir := t.TempDir()
	reg := filepath.Join(dir, "pressure")
	const content = "keep me\n"
	require.NoError(t, os.WriteFile(reg, []byte(content), 0o600))
	link := filepath.Join(dir, "link")
	require.NoError(t, os.Symlink(reg, link))
	trig := base64.StdEncoding.EncodeToString([]byte("some 200000 2000000"))
	paths := []string{reg, link, dir, "/dev/zero", "/proc/self/status"}
	if l, err := cgroupfs.Of(0); err == nil && l.Version == 1 {
		// A cgroup file that is no PSI file; memory.force_empty would act
		// on any write, so the harmless memory.pressure_level stands for it.
		paths = append(paths, filepath.Join(l.Dir, "memory.pressure_level"))
	}
	for _, path := range paths {
		t.Run(filepath.Base(path), func(t *testing.T) {
			t.Setenv("MEMORY_PRESSURE_WATCH", path)
			t.Setenv("MEMORY_PRESSURE_WRITE", trig)
			var logs syncBuf
			m, err := pressure.Start(pressure.Config{Watch: "auto", SpiralOff: true,
				Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Logf("no fallback source here: %v", err)
			}
			assert.NotContains(t, m.Source(), "systemd", "not a PSI file: fell back")
			out := warnedOr(logs.String(), err)
			assert.Contains(t, out, "level=WARN", out)
			assert.Contains(t, out, "$MEMORY_PRESSURE_WATCH", "the WARN names the variable: %s", out)
			require.NoError(t, m.Close())

			m, err = pressure.Start(pressure.Config{Watch: "systemd", SpiralOff: true, Logger: discard})
			require.ErrorIs(t, err, pressure.ErrNoSource)
			assert.Contains(t, err.Error(), "$MEMORY_PRESSURE_WATCH")
			require.NoError(t, m.Close())
		})
	}
	b, err := os.ReadFile(reg)
	require.NoError(t, err)
	assert.Equal(t, content, string(b), "the trigger was not written into the file")
}

// Attack inputs (issue 17): $MEMORY_PRESSURE_WRITE values that are not
// base64, are oversized, or decode to something that is not a PSI trigger
// (window out of the kernel's 500 ms..10 s, threshold over the window,
// trailing bytes after the NUL): each a WARN naming the variable and a
// fallback, never an arming.
func TestSystemdWriteHostile(t *testing.T) {
	if _, err := os.Stat("/proc/pressure/memory"); err != nil {
		t.Skipf("the kernel has no PSI (CONFIG_PSI): %v", err)
	}
	defer goleak.VerifyNone(t)
	t.Setenv("MEMORY_PRESSURE_WATCH", "/proc/pressure/memory")
	b64 := base64.StdEncoding.EncodeToString
	for name, v := range map[string]string{
		"not base64":           "not*base64!",
		"oversized":            b64(bytes.Repeat([]byte("some 200000 2000000 "), 1000)),
		"window under 500 ms":  b64([]byte("some 100000 400000")),
		"window over 10 s":     b64([]byte("some 200000 10000001")),
		"threshold > window":   b64([]byte("some 3000000 2000000")),
		"garbage after NUL":    b64([]byte("some 200000 2000000\x00garbage")),
		"only a NUL":           b64([]byte("\x00")),
		"tab separated":        b64([]byte("some\t200000\t2000000")),
		"unsigned 32-bit wrap": b64([]byte("some 4294967496 2000000")),
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv("MEMORY_PRESSURE_WRITE", v)
			var logs syncBuf
			m, err := pressure.Start(pressure.Config{Watch: "auto", SpiralOff: true,
				Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Logf("no fallback source here: %v", err)
			}
			assert.NotContains(t, m.Source(), "systemd")
			out := warnedOr(logs.String(), err)
			assert.Contains(t, out, "level=WARN")
			assert.Contains(t, out, "$MEMORY_PRESSURE_WRITE", "the WARN names the variable")
			require.NoError(t, m.Close())
		})
	}
}

// A trigger with leading zeros is armed as the kernel would read it
// without them: psi_write reads at most 32 bytes and overwrites the last
// with NUL, so "some 000000000000200000 10000000" (32 bytes) would have
// been armed with a window of 1 s instead of 10 s (and refused without
// CAP_SYS_RESOURCE, 1 s not being a multiple of 2 s).
func TestSystemdTriggerShortestForm(t *testing.T) {
	for in, want := range map[string]string{
		"some 000000000000200000 10000000":                          "some 200000 10000000\x00",
		"full 0000000000000000000000000000000000000500000 02000000": "full 500000 2000000\x00",
	} {
		got, err := memsignal.SystemdTrigger([]byte(in))
		require.NoError(t, err, "%q", in)
		assert.Equal(t, want, string(got))
		assert.LessOrEqual(t, len(got), 32, "within the kernel's buffer")
	}
	_, err := memsignal.SystemdTrigger([]byte("some 200000 2000000\x00garbage"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "$MEMORY_PRESSURE_WRITE")
}

// Attack inputs (issue 17): "/dev/null" spelled otherwise still turns
// watching off (before, "//dev/null" was opened as a PSI file and armed
// for nothing; with the PSI-file check it would have fallen back to
// watching against the service manager's word), and a
// $MEMORY_PRESSURE_WRITE without its base64 padding is decoded.
func TestSystemdDevNullAndPadding(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, p := range []string{"//dev/null", "/dev/null/", "/dev/../dev/null", " /dev/null "} {
		t.Setenv("MEMORY_PRESSURE_WATCH", p)
		var logs syncBuf
		m, err := pressure.Start(pressure.Config{SpiralOff: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		require.NoError(t, err, "%q", p)
		assert.Empty(t, m.Source(), "%q: watching turned off", p)
		assert.NotContains(t, logs.String(), "level=WARN", "%q", p)
		require.NoError(t, m.Close())
	}
	fifo := filepath.Join(t.TempDir(), "mp")
	require.NoError(t, unix.Mkfifo(fifo, 0o600))
	t.Setenv("MEMORY_PRESSURE_WATCH", fifo)
	t.Setenv("MEMORY_PRESSURE_WRITE", base64.RawStdEncoding.EncodeToString([]byte("some 200000 2000000")))
	m, err := pressure.Start(pressure.Config{Watch: "systemd", SpiralOff: true, Logger: discard})
	require.NoError(t, err)
	assert.Equal(t, "systemd "+fifo, m.Source())
	require.NoError(t, m.Close())
}

// Attack input (issue 17): $MEMORY_PRESSURE_WATCH a socket file nobody
// listens on any more (a service manager restarted): a WARN naming the
// variable and a fallback.
func TestSystemdStaleSocket(t *testing.T) {
	defer goleak.VerifyNone(t)
	sock := filepath.Join(t.TempDir(), "mp.sock")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	require.NoError(t, unix.Bind(fd, &unix.SockaddrUnix{Name: sock}))
	require.NoError(t, unix.Close(fd)) // the file stays, nothing listens
	t.Setenv("MEMORY_PRESSURE_WATCH", sock)
	t.Setenv("MEMORY_PRESSURE_WRITE", "")
	var logs syncBuf
	m, err := pressure.Start(pressure.Config{SpiralOff: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Logf("no fallback source here: %v", err)
	}
	assert.NotContains(t, m.Source(), "systemd")
	out := warnedOr(logs.String(), err)
	assert.Contains(t, out, "level=WARN")
	assert.Contains(t, out, "$MEMORY_PRESSURE_WATCH")
	assert.Contains(t, out, "connection refused")
	require.NoError(t, m.Close())
}

// Attack input (issue 17): memory.events counters that jump by more than
// math.MaxInt64 together. Before, their growth wrapped negative, which the
// watcher reads as its source gone: it stopped watching for good.
func TestEventsGrowthSaturates(t *testing.T) {
	const big = int64(1<<63 - 1)
	a := cgroupfs.Events{Low: 0, High: 0, Max: 0, OOM: 0, OOMKill: 0, OOMGroupKill: 0}
	b := cgroupfs.Events{Low: 0, High: big, Max: big, OOM: big, OOMKill: big, OOMGroupKill: 0}
	assert.Equal(t, big, memsignal.EventsGrowth(a, b))
}
