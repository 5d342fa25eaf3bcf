package main

// Issue 22, second round: memctl status -pid against hostile targets for
// the state record and the cgroup views: a record republished while it is
// read, a record rewritten in place, a file named like the record that is
// no memfd, a target holding thousands of descriptors, a target in another
// mount namespace that shows no cgroup mount.

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/internal/safefs"
	"github.com/memctl/memctl/internal/state"
)

// republishChild publishes records with state.Publish as fast as it can,
// alternating one pool and state.MaxPools pools (records of about 100
// bytes and of about 8 KiB), until its standard input is closed.
func republishChild() {
	small := &state.Record{Pools: []state.Pool{{Name: "one", Mode: "enforce"}}}
	big := &state.Record{}
	for i := range state.MaxPools {
		big.Pools = append(big.Pools, state.Pool{Name: fmt.Sprintf("pool-%02d-%s", i, strings.Repeat("x", 100)), Mode: "observe"})
	}
	if err := state.Publish(small); err != nil {
		childtest.Fail("Publish: %v", err)
	}
	untilStdinClosed(func(i int) {
		r := small
		if i%2 == 1 {
			r = big
		}
		if err := state.Publish(r); err != nil {
			childtest.Fail("Publish: %v", err)
		}
	})
}

// untilStdinClosed reports the child's PID and that it is ready, then calls
// step with 0, 1, 2... until its standard input is closed.
func untilStdinClosed(step func(i int)) {
	done := make(chan struct{})
	go func() { _, _ = io.ReadAll(os.Stdin); close(done) }()
	childtest.Say("PID", os.Getpid())
	childtest.Say("READY", 1)
	for i := 0; ; i++ {
		select {
		case <-done:
			return
		default:
		}
		step(i)
	}
}

// rewriteChild holds an unsealed memfd named like the record and rewrites
// it in place, alternating two valid records of different lengths, until
// its standard input is closed: a reader could see half of each.
func rewriteChild() {
	fd, err := unix.MemfdCreate(state.MemfdName, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		childtest.Fail("memfd_create: %v", err)
	}
	recs := [][]byte{
		[]byte(`{"version":1,"pid":1,"seq":1,"updated":"2026-12-01T10:00:00Z","c_heap":"short"}`),
		[]byte(`{"version":1,"pid":1,"seq":2,"updated":"2026-12-01T10:00:00Z","c_heap":"` + strings.Repeat("long", 1000) + `"}`),
	}
	untilStdinClosed(func(i int) {
		_ = unix.Ftruncate(fd, 0)
		_, _ = unix.Pwrite(fd, recs[i%2], 0)
	})
}

// fdsChild opens MEMCTL_TEST_FDS descriptors (dups of /dev/null, raising
// its RLIMIT_NOFILE as far as needed), then publishes a record, so that
// the record's descriptor is the last of them; then PID, FD and READY, and
// it waits for its standard input.
func fdsChild() {
	n, _ := strconv.Atoi(os.Getenv("MEMCTL_TEST_FDS"))
	want := uint64(n + 64)
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		childtest.Fail("getrlimit: %v", err)
	}
	if lim.Cur < want {
		lim.Cur, lim.Max = want, max(lim.Max, want)
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
			childtest.Say("SKIP", "setrlimit "+err.Error())
			childtest.Say("READY", 1)
			_, _ = io.ReadAll(os.Stdin)
			return
		}
	}
	null, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		childtest.Fail("open: %v", err)
	}
	for range n {
		if _, err := unix.FcntlInt(uintptr(null), unix.F_DUPFD_CLOEXEC, 0); err != nil {
			childtest.Fail("dup: %v", err)
		}
	}
	if err := state.Publish(&state.Record{CHeap: "many-fds"}); err != nil {
		childtest.Fail("Publish: %v", err)
	}
	childtest.Say("PID", os.Getpid())
	childtest.Say("FD", state.Descriptor())
	childtest.Say("READY", 1)
	_, _ = io.ReadAll(os.Stdin)
}

// TestStatusRecordReplacedWhileRead: a process that republishes its record
// without pause (dup3 onto the same descriptor, sealed memfds of 100 bytes
// and 8 KiB in turn) is read whole every time, old or new, never half of
// each: 300 reads, every one parses, none unknown.
func TestStatusRecordReplacedWhileRead(t *testing.T) {
	pid := int(childtest.RequireInt(t, startReady(t, childtest.Command(t, "republish", operatorVars)), "PID"))
	seen := map[int]int{}
	for range 300 {
		st, err := readStatus(pid, false)
		require.NoError(t, err)
		require.Empty(t, st.Unknown["memctl"])
		require.NotNil(t, st.Memctl)
		seen[len(st.Memctl.Pools)]++
		for _, p := range st.Memctl.Pools {
			require.NotEmpty(t, p.Name, "a whole record")
		}
	}
	for n := range seen {
		assert.Contains(t, []int{1, state.MaxPools}, n, "pools seen: %v", seen)
	}
	t.Logf("records seen by pool count: %v", seen)
}

// TestStatusRecordRewrittenInPlace: a process rewrites an unsealed memfd
// named like the record in place; status refuses it every time for what it
// is (not sealed: it could change while read), never shows part of it.
func TestStatusRecordRewrittenInPlace(t *testing.T) {
	pid := int(childtest.RequireInt(t, startReady(t, childtest.Command(t, "rewrite", operatorVars)), "PID"))
	for range 100 {
		st, err := readStatus(pid, false)
		require.NoError(t, err)
		assert.Nil(t, st.Memctl)
		require.Contains(t, st.Unknown["memctl"], "not a sealed memfd")
	}
	out, _, code := result(t, memctl(t, nil, "status", "-pid", strconv.Itoa(pid)))
	assert.Equal(t, exitPartial, code)
	assert.Regexp(t, `(?m)^memctl +unknown: open "/proc/\d+/fd/\d+": not a sealed memfd: seals 0x0, want 0xe$`, out)
}

// TestStatusFileNamedLikeRecord: a file that is no memfd but whose
// /proc/PID/fd link reads exactly "/memfd:memctl-state (deleted)" (a tmpfs
// file of that name, opened, deleted and its mount detached, so the link
// shows the path from the detached mount's root) was read as the record.
// It is refused: not sealed, as no plain tmpfs file can be.
func TestStatusFileNamedLikeRecord(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a private mount namespace and a tmpfs")
	}
	dir := t.TempDir()
	script := `set -eu
mount --make-rprivate /
mount -t tmpfs none "$DIR"
printf '{"version":1,"pid":1,"seq":1,"updated":"2026-12-01T10:00:00Z","c_heap":"forged\033[2J"}' > "$DIR/memfd:memctl-state"
exec 3< "$DIR/memfd:memctl-state"
rm "$DIR/memfd:memctl-state"
umount -l "$DIR"
echo READY
read x || true
`
	pid := startShell(t, script, &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}, "DIR="+dir)
	link, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/3")
	require.NoError(t, err)
	require.Equal(t, "/memfd:"+state.MemfdName+" (deleted)", link, "the link reads as the record's")
	for _, args := range [][]string{nil, {"-json"}} {
		out, errOut, code := result(t, memctl(t, nil, append([]string{"status", "-pid", strconv.Itoa(pid)}, args...)...))
		assert.Equal(t, exitPartial, code)
		assert.Empty(t, errOut)
		assert.NotContains(t, out, "forged")
		assert.NotContains(t, out, "\x1b")
		assert.Contains(t, out, "not a sealed memfd: seals 0x1, want 0xe", "a tmpfs file has F_SEAL_SEAL alone")
	}
}

// TestStatusManyFDs: a process holding thousands of descriptors, its record
// on the last: found (every entry is looked at, up to safefs.MaxFDs); one
// holding more than MaxFDs before its record (needs CAP_SYS_RESOURCE to
// raise RLIMIT_NOFILE): the record is unknown with the reason, exit 3, with
// a short message.
func TestStatusManyFDs(t *testing.T) {
	if testing.Short() {
		t.Skip("opens up to 70,000 descriptors (-short)")
	}
	for _, tc := range []struct {
		fds  int
		code int
	}{{15000, exitOK}, {safefs.MaxFDs + 5000, exitPartial}} {
		t.Run(strconv.Itoa(tc.fds), func(t *testing.T) {
			rep := startReady(t, childtest.Command(t, "fds", operatorVars, "MEMCTL_TEST_FDS="+strconv.Itoa(tc.fds)))
			if rep["SKIP"] != "" {
				// No CAP_SYS_RESOURCE to raise the hard limit (as in
				// this project's containers): the cap itself is
				// checked in safefs (TestReadMemfdManyFDs).
				t.Skip(rep["SKIP"])
			}
			fd := int(childtest.RequireInt(t, rep, "FD"))
			require.Greater(t, fd, tc.fds, "the record is after the others")
			for _, args := range [][]string{nil, {"-json"}} {
				out, errOut, code := result(t, memctl(t, nil, append([]string{"status", "-pid", rep["PID"]}, args...)...))
				assert.Equal(t, tc.code, code)
				assert.Empty(t, errOut)
				assert.Less(t, len(out), 8<<10)
				if tc.code == exitOK {
					assert.Contains(t, out, `"many-fds"`)
					assert.Contains(t, out, "/fd/"+rep["FD"]+`"`)
				} else {
					assert.Contains(t, out, fmt.Sprintf("file larger than the cap: more than %d descriptors", safefs.MaxFDs))
				}
			}
		})
	}
}

// TestStatusOtherMountNamespaceNoCgroupMount: a process in its own mount
// namespace that unmounted every cgroup hierarchy was shown "cgroup none",
// exit 0, though its cgroup has a 256 MiB limit. /proc/PID/cgroup (the
// kernel's, relative to memctl's cgroup namespace) is read in memctl's own
// mounts: its limit, view "memctl", exit 0. Nothing of the process's mounts
// is read.
func TestStatusOtherMountNamespaceNoCgroupMount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a private mount namespace")
	}
	g := cgrouptest.New(t, 256<<20)
	script := `set -eu
echo $$ > "$PROCS"
mount --make-rprivate /
umount -R -l /sys/fs/cgroup
if grep -q cgroup /proc/self/mountinfo; then echo "STILL-MOUNTED"; exit 1; fi
echo READY
read x || true
`
	procs := filepath.Join(g.Dir, "cgroup.procs")
	pid := startShell(t, script, &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}, "PROCS="+procs)
	p := strconv.Itoa(pid)
	self, err := os.Readlink("/proc/self/ns/mnt")
	require.NoError(t, err)
	other, err := os.Readlink("/proc/" + p + "/ns/mnt")
	require.NoError(t, err)
	require.NotEqual(t, self, other, "another mount namespace")

	js, _, code := result(t, memctl(t, nil, "status", "-json", "-pid", p))
	require.Equal(t, exitOK, code)
	assert.Contains(t, js, `"view": "memctl"`)
	assert.Contains(t, js, `"limit_bytes": 268435456`)
	table, _, code := result(t, memctl(t, nil, "status", "-pid", p))
	require.Equal(t, exitOK, code)
	assert.Regexp(t, `(?m)^memory limit +268435456 bytes \(256\.0 MiB\) from "`+regexpQuote(g.Dir)+`/memory\.(limit_in_bytes|max)"$`, table)
	assert.Contains(t, table, "(read in memctl's mount namespace: the process's own mounts no hierarchy with its memory controller)")
}

// TestStatusChrootedRecord: a process chrooted in an empty directory
// publishes its record there; status reads it through /proc/PID/fd (no
// path inside the chroot is needed) and its cgroup from memctl's root.
func TestStatusChrootedRecord(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chroot")
	}
	dir := t.TempDir()
	cmd := childtest.Command(t, "chroot", operatorVars, "MEMCTL_TEST_CHROOT="+dir, "MEMCTL_TEST_CHROOT_RECORD=1")
	pid := startReady(t, cmd)["PID"]
	out, _, code := result(t, memctl(t, nil, "status", "-pid", pid))
	require.Equal(t, exitOK, code, out)
	assert.Regexp(t, `(?m)^  C heap +"chrooted"$`, out)
	assert.Contains(t, out, "read from memctl's root")
}

// pidReuseChild runs as PID 1 of a new PID namespace (with its own /proc):
// it starts a process, reads it with readStatus, and between the start
// time's read and the rest kills it and starts another that gets the same
// PID (ns_last_pid, which is the namespace's own). It says REUSED (1 when
// the second process got the PID) and RESULT (the error, or "read").
func pidReuseChild() {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		childtest.Fail("make-rprivate: %v", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		childtest.Fail("mount proc: %v", err)
	}
	first := exec.Command("/bin/sleep", "60")
	if err := first.Start(); err != nil {
		childtest.Fail("start: %v", err)
	}
	pid := first.Process.Pid
	var second *exec.Cmd
	testHookAfterStart = func() {
		_ = first.Process.Kill()
		_ = first.Wait()
		if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(pid-1)), 0); err != nil {
			childtest.Fail("ns_last_pid: %v", err)
		}
		second = exec.Command("/bin/sleep", "60")
		if err := second.Start(); err != nil {
			childtest.Fail("start: %v", err)
		}
	}
	_, err := readStatus(pid, false)
	reused := 0
	if second != nil && second.Process.Pid == pid {
		reused = 1
	}
	childtest.Say("REUSED", reused)
	if err != nil {
		childtest.Say("RESULT", err.Error())
	} else {
		childtest.Say("RESULT", "read")
	}
	if second != nil {
		_ = second.Process.Kill()
		_ = second.Wait()
	}
}

// TestStatusPIDReused: the process exits while status reads it and another
// gets its PID at once (forced in a PID namespace of the test's own with
// ns_last_pid): status does not show the second process's files as the
// first's; it gives the one error that the process exited.
func TestStatusPIDReused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a PID namespace")
	}
	cmd := childtest.Command(t, "pidreuse", operatorVars)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	if err != nil && strings.Contains(string(out), "operation not permitted") {
		t.Skipf("no PID namespace here: %s", out)
	}
	require.NoError(t, err, "%s", out)
	rep := childtest.ParseReport(out)
	require.Equal(t, "1", rep["REUSED"], "the second process got the PID: %s", out)
	assert.Regexp(t, `^process \d+ exited while memctl read it$`, rep["RESULT"])
}
