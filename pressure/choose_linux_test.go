package pressure_test

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/memctl/memctl"
	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/childtest"

	"github.com/memctl/memctl/internal/procfs"
	"github.com/memctl/memctl/pressure"
)

// warnedOr returns the log, or, where no other source could be watched
// (Start then returns the error and logs nothing: the facade logs it at
// WARN), the error as that WARN would say it.
func warnedOr(logs string, err error) string {
	if err != nil {
		return "level=WARN " + err.Error()
	}
	return logs
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
		got, err := pressure.SystemdTrigger([]byte(in))
		require.NoError(t, err, "%q", in)
		assert.Equal(t, want, string(got))
		assert.LessOrEqual(t, len(got), 32, "within the kernel's buffer")
	}
	_, err := pressure.SystemdTrigger([]byte("some 200000 2000000\x00garbage"))
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

// TestPSITriggerWindows: a trigger window under 2 s needs CAP_SYS_RESOURCE
// (Linux 6.5 and later refuse windows that are not a multiple of 2 s to
// other processes with EINVAL), which is why the default window is 2 s.
// Root in a container often lacks the capability (this machine's root
// does): the test checks whichever applies.
func TestPSITriggerWindows(t *testing.T) {
	if _, err := os.Stat("/proc/pressure/memory"); err != nil {
		t.Skipf("the kernel has no PSI (CONFIG_PSI): %v", err)
	}
	defer goleak.VerifyNone(t)
	m, err := pressure.Start(pressure.Config{Watch: "system", SpiralOff: true, Logger: discard,
		Stall: 50 * time.Millisecond, StallWindow: 500 * time.Millisecond})
	if hasCap(t, unix.CAP_SYS_RESOURCE) {
		require.NoError(t, err)
		assert.Equal(t, "host-wide PSI /proc/pressure/memory (some 50ms in 500ms)", m.Source())
	} else {
		t.Log("no CAP_SYS_RESOURCE: a 500 ms window must be refused")
		require.ErrorIs(t, err, unix.EINVAL)
		assert.Contains(t, err.Error(), `"some 50000 500000\x00"`)
		assert.Contains(t, err.Error(), "needs CAP_SYS_RESOURCE", "the error says why")
		require.NotNil(t, m)
		assert.Empty(t, m.Source())
	}
	require.NoError(t, m.Close())
	// The default 2 s window is accepted either way.
	m, err = pressure.Start(pressure.Config{Watch: "system", SpiralOff: true, Logger: discard})
	require.NoError(t, err)
	require.NoError(t, m.Close())
}

// hasCap reports whether this process has capability c in its effective
// set (CapEff in /proc/self/status, proc(5)).
func hasCap(t *testing.T, c int) bool {
	t.Helper()
	f, err := procfs.ReadFile("/proc/self/status")
	require.NoError(t, err)
	v, ok := f.String("CapEff")
	require.True(t, ok)
	n, err := strconv.ParseUint(v, 16, 64)
	require.NoError(t, err)
	return n&(1<<c) != 0
}

func TestSystemdOffAndErrors(t *testing.T) {
	t.Setenv("MEMORY_PRESSURE_WATCH", "/dev/null")
	m, err := pressure.Start(pressure.Config{SpiralOff: true, Logger: discard})
	require.NoError(t, err)
	assert.Empty(t, m.Source(), "/dev/null: the service manager turned watching off")
	require.NoError(t, m.Close())

	t.Setenv("MEMORY_PRESSURE_WATCH", filepath.Join(t.TempDir(), "missing"))
	m, err = pressure.Start(pressure.Config{Watch: "systemd", SpiralOff: true, Logger: discard})
	require.ErrorIs(t, err, pressure.ErrNoSource)
	require.ErrorIs(t, err, errors.ErrUnsupported)
	assert.Contains(t, err.Error(), "missing")
	require.NotNil(t, m, "the detector runs without a watcher")
	assert.Empty(t, m.Source())
	require.NoError(t, m.Close())
}

// TestAutoFallsBack: in "auto", a $MEMORY_PRESSURE_WATCH that cannot be
// opened is reported once (INFO) and the next source is watched.
func TestAutoFallsBack(t *testing.T) {
	defer goleak.VerifyNone(t)
	missing := filepath.Join(t.TempDir(), "missing")
	t.Setenv("MEMORY_PRESSURE_WATCH", missing)
	var buf bytes.Buffer
	m, err := pressure.Start(pressure.Config{SpiralOff: true, Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	if err != nil {
		t.Skipf("no other source here: %v", err)
	}
	defer m.Close()
	assert.NotContains(t, m.Source(), "systemd")
	assert.Contains(t, buf.String(), "memory pressure source skipped")
	assert.Contains(t, buf.String(), missing)
}

// Input (issue 17, case 3): $MEMORY_PRESSURE_WRITE = base64 of "some
// 200000 2000000" with no NUL, on /proc/pressure/memory. Without
// CAP_SYS_RESOURCE (this machine's root) the kernel refused the write with
// EINVAL before the NUL was appended; now it is armed. (With the
// capability it was armed as "some 200000 200000": TestSystemdTriggerArmed
// runs that in a user namespace.) A value that is no trigger is a WARN
// naming the variable, and the watcher falls back.
func TestSystemdWriteWithoutNUL(t *testing.T) {
	if _, err := os.Stat("/proc/pressure/memory"); err != nil {
		t.Skipf("the kernel has no PSI (CONFIG_PSI): %v", err)
	}
	defer goleak.VerifyNone(t)
	t.Setenv("MEMORY_PRESSURE_WATCH", "/proc/pressure/memory")
	t.Setenv("MEMORY_PRESSURE_WRITE", base64.StdEncoding.EncodeToString([]byte("some 200000 2000000")))
	var buf bytes.Buffer
	m, err := pressure.Start(pressure.Config{Watch: "auto", SpiralOff: true,
		Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	if errors.Is(err, os.ErrPermission) {
		t.Skipf("writing a PSI trigger needs root here: %v", err)
	}
	require.NoError(t, err)
	assert.Equal(t, "systemd /proc/pressure/memory", m.Source())
	assert.NotContains(t, buf.String(), "level=WARN")
	require.NoError(t, m.Close())

	for _, bad := range []string{"hello", "some 200000", "some 200000 20000000"} {
		buf.Reset()
		t.Setenv("MEMORY_PRESSURE_WRITE", base64.StdEncoding.EncodeToString([]byte(bad)))
		m, err = pressure.Start(pressure.Config{Watch: "auto", SpiralOff: true,
			Logger: slog.New(slog.NewTextHandler(&buf, nil))})
		if err != nil {
			t.Logf("no fallback source here: %v", err)
		}
		assert.NotContains(t, m.Source(), "systemd", "%q: fell back", bad)
		assert.Contains(t, buf.String(), "level=WARN")
		assert.Contains(t, buf.String(), "$MEMORY_PRESSURE_WRITE", "the WARN names the variable")
		require.NoError(t, m.Close())
	}
	// Only systemd asked for: an error naming the variable.
	m, err = pressure.Start(pressure.Config{Watch: "systemd", SpiralOff: true, Logger: discard})
	require.ErrorIs(t, err, pressure.ErrNoSource)
	assert.Contains(t, err.Error(), "$MEMORY_PRESSURE_WRITE")
	require.NoError(t, m.Close())
}

// childArmed (case 3): watches $MEMORY_PRESSURE_WATCH through systemd's
// protocol until a signal or WAIT_S, and reports its capability and the
// signals.
func childArmed() {
	childtest.Say("CAP_SYS_RESOURCE", capEff()&(1<<unix.CAP_SYS_RESOURCE) != 0)
	m, err := pressure.Start(pressure.Config{Watch: "systemd", SpiralOff: true,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	childtest.Say("ERR", strconv.Quote(fmt.Sprint(err)))
	childtest.Say("SOURCE", strconv.Quote(m.Source()))
	childtest.Say("READY", 1)
	for deadline := time.Now().Add(time.Duration(envInt("WAIT_S")) * time.Second); time.Now().Before(deadline) && m.Stats().Signals == 0; {
		time.Sleep(50 * time.Millisecond)
	}
	childtest.Say("SIGNALS", m.Stats().Signals)
	_ = m.Close()
}

func capEff() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		childtest.Fail("%v", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				childtest.Fail("%v", err)
			}
			return n
		}
	}
	return 0
}

// Input (issue 17, case 3), the writer with CAP_SYS_RESOURCE: in a user
// namespace (where this machine's root has the capability; the kernel
// checks the opener's effective set), "some 200000 2000000" without its
// NUL was armed as "some 200000 200000", a 100% stall threshold that never
// fires. With the NUL appended it fires while a neighbour thrashes a small
// cgroup; a plain-root child beside it (no capability: the write failed
// with EINVAL before) fires too. Measured here by hand with the same
// neighbour (three readers, PSI some avg10 14%), over 25 s, writing to
// /proc/pressure/memory from a user namespace: 0 events without the NUL,
// 11 with it, 10 for plain root with it.
func TestSystemdTriggerArmed(t *testing.T) {
	if testing.Short() {
		t.Skip("waits up to 45 s for host-wide pressure")
	}
	if !cgoEnabled {
		t.Skip("runs once in CI, in the cgo build: nothing in it depends on cgo")
	}
	if _, err := os.Stat("/proc/pressure/memory"); err != nil {
		t.Skipf("the kernel has no PSI: %v", err)
	}
	if l, err := cgroupfs.Of(0); err != nil || l.Version != 1 {
		t.Skipf("the neighbour needs a cgroup v1 memory controller (this process: %+v, %v)", l, err)
	}
	t.Parallel() // beside the scenarios of cases 1 and 2: their pressure only helps
	env := []string{"MEMORY_PRESSURE_WATCH=/proc/pressure/memory", "WAIT_S=45",
		"MEMORY_PRESSURE_WRITE=" + base64.StdEncoding.EncodeToString([]byte("some 200000 2000000"))}
	userns := childtest.Command(t, "armed", memctlUnset, env...)
	userns.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}}}
	plain := childtest.Command(t, "armed", memctlUnset, env...)
	u := startArm(t, userns)
	p := startArm(t, plain)
	<-u.ready
	<-p.ready
	stall0, t0 := psiSomeTotal(), time.Now()
	rd := neighbour(t, 50, 4)
	ur, pr := u.wait(t), p.wait(t)
	_ = rd.cmd.Process.Kill()
	t.Logf("user namespace: %v", ur)
	t.Logf("plain root: %v", pr)
	for _, r := range []map[string]string{ur, pr} {
		assert.Equal(t, strconv.Quote("<nil>"), r["ERR"])
		assert.Equal(t, strconv.Quote("systemd /proc/pressure/memory"), r["SOURCE"])
		requireSignals(t, num(t, r, "SIGNALS"), stall0, time.Since(t0), "the trigger is armed as 200 ms in 2 s and fires")
	}
	assert.Equal(t, "true", ur["CAP_SYS_RESOURCE"], "the user namespace's root has the capability")
}

// childReadOnlyCgroup (case 4): in a private mount namespace, bind-remount
// the v1 memory hierarchy read-only (as Docker and Kubernetes mount it) when
// RO is set, then run memctl.Start and report the source, the note and the
// startup line.
func childReadOnlyCgroup() {
	if os.Getenv("RO") != "" {
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			childtest.Fail("make / private: %v", err)
		}
		// MS_BIND|MS_REMOUNT changes this mount's flags only, not the
		// cgroup file system's (the host's mounts stay read-write).
		mnt := os.Getenv("MOUNT")
		if err := unix.Mount("", mnt, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			childtest.Fail("remount %s read-only: %v", mnt, err)
		}
	}
	var log strings.Builder
	ctl, err := memctl.Start(memctl.WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
	childtest.Say("ERR", strconv.Quote(fmt.Sprint(err)))
	childtest.Say("SOURCE", strconv.Quote(ctl.Report().Pressure))
	childtest.Say("NOTE", strconv.Quote(ctl.Report().PressureNote))
	for _, l := range strings.Split(log.String(), "\n") {
		if strings.Contains(l, `msg="memctl started"`) {
			childtest.Say("STARTED", strconv.Quote(l))
		}
	}
	_ = ctl.Close()
}

// Input (issue 17, case 4): a read-only cgroup mount silently meant
// host-wide PSI. Writing cgroup.event_control fails with EROFS; memctl now
// says in its startup line (INFO, once) that it watches host-wide PSI and
// why. The same child without the remount watches its cgroup.
func TestReadOnlyCgroupSaysHostWide(t *testing.T) {
	if _, err := os.Stat("/proc/pressure/memory"); err != nil {
		t.Skipf("the kernel has no PSI: %v", err)
	}
	l, err := cgroupfs.Of(0)
	if err != nil || l.Version != 1 {
		t.Skipf("needs a cgroup v1 memory controller (this process: %+v, %v)", l, err)
	}
	if os.Getuid() != 0 {
		t.Skip("needs root for a mount namespace")
	}
	mnt := filepath.Dir(l.Dir)
	for mnt != "/" {
		if _, err := os.Stat(filepath.Join(mnt, "cgroup.sane_behavior")); err == nil {
			break // the v1 hierarchy's root
		}
		mnt = filepath.Dir(mnt)
	}
	require.NotEqual(t, "/", mnt, "the v1 memory hierarchy's mount point above %s", l.Dir)
	g := newGroup(t, 256<<20)
	run := func(env ...string) map[string]string {
		cmd := childtest.Command(t, "rocgroup", memctlUnset, append(env, "MOUNT="+mnt)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
		g.Wrap(cmd)
		return childtest.Report(t, cmd)
	}
	rw := run()
	t.Logf("read-write: %v", rw)
	assert.Contains(t, rw["SOURCE"], "cgroup v1 "+g.Dir)
	assert.Equal(t, strconv.Quote(""), rw["NOTE"])

	ro := run("RO=1")
	t.Logf("read-only: %v", ro)
	assert.Contains(t, ro["SOURCE"], "host-wide PSI /proc/pressure/memory")
	assert.Contains(t, ro["NOTE"], "read-only cgroup mount")
	assert.Contains(t, ro["NOTE"], "read-only file system", "the EROFS of cgroup.event_control")
	started, err := strconv.Unquote(ro["STARTED"])
	require.NoError(t, err)
	assert.Contains(t, started, "level=INFO")
	assert.Contains(t, started, `pressure="host-wide PSI`)
	assert.Contains(t, started, `; read-only cgroup mount"`, "the INFO line says why")
}
