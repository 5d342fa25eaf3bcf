package main

// Regression tests for issue 9: memctl status run as root on a process that
// shapes its own mount namespace against it.

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgrouptest"
)

// secretMarker is the content of a file only root can read.
const secretMarker = "SECRET-MARKER-i9-3f1c"

// findCgroupSetup is the start of both hostile scripts: a private mount
// namespace, and in it the process's memory cgroup (cg), the mount point
// of its hierarchy (point) and its limit file (file), v1 or v2.
const findCgroupSetup = `set -eu
mount --make-rprivate /
cg=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ {print $3}' /proc/self/cgroup)
if [ -n "$cg" ]; then
	point=$(awk '/ - cgroup / && $NF ~ /(^|,)memory(,|$)/ {print $5; exit}' /proc/self/mountinfo)
	file=memory.limit_in_bytes
else
	cg=$(awk -F: '$1 == "0" {print $3}' /proc/self/cgroup)
	point=$(awk '/ - cgroup2 / {print $5; exit}' /proc/self/mountinfo)
	file=memory.max
fi
`

// hostileSetup is the shell the hostile process runs before it says READY
// and waits for its standard input to close. It finds its memory cgroup
// (v1 memory controller, else v2) and the hierarchy's mount point, mounts a
// tmpfs over the mount point's parent (/sys/fs/cgroup on a v1 host) and
// makes, in place of the cgroup's limit file, what $KIND says. Mounts made
// here never propagate to the host (rprivate).
const hostileSetup = findCgroupSetup + `[ -n "$point" ] || { echo "NO-CGROUP-MOUNT"; exit 1; }
mount -t tmpfs none "$(dirname "$point")"
d="$point$cg"
mkdir -p "$d"
case "$KIND" in
secret) ln -s "$SECRET" "$d/$file" ;;
secret-bind) : > "$d/$file"; mount --bind "$SECRET" "$d/$file" ;;
zero) ln -s /dev/zero "$d/$file" ;;
zero-bind) : > "$d/$file"; mount --bind /dev/zero "$d/$file" ;;
fifo) mkfifo "$d/$file" ;;
huge) truncate -s 1G "$d/$file" ;;
esac
echo READY
read x || true
`

// escSetup moves the v1 memory (or v2) hierarchy, in a private mount
// namespace, to a mount point whose name holds terminal escapes, and puts in
// place of the cgroup's limit file under it what $KIND says: a FIFO, a
// value with escapes, or 45000 bytes of them.
const escSetup = findCgroupSetup + `[ "$cg" != "/" ] || { echo "CGROUP-IS-ROOT"; exit 1; }
esc="$ESCDIR/$(printf 'evil\033[2J\033]0;owned\007\302\233name')"
mkdir -p "$esc"
mount --bind "$point" "$esc"
umount -l "$point"
mount -t tmpfs none "$esc$cg"
case "$KIND" in
fifo) mkfifo "$esc$cg/$file" ;;
garbage) printf 'garbage\033[31m\n' > "$esc$cg/$file" ;;
long) awk 'BEGIN { for (i = 0; i < 5000; i++) printf "\033[31mXXXX" }' > "$esc$cg/$file" ;;
esac
echo READY
read x || true
`

// userNamespaces skips t when this kernel or machine does not let a
// process create a user namespace.
func userNamespaces(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the attack is on root's memctl status")
	}
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err != nil || strings.TrimSpace(string(b)) == "0" {
		t.Skipf("user namespaces disabled here (/proc/sys/user/max_user_namespaces: %q, %v)", b, err)
	}
	if b, err := os.ReadFile("/proc/sys/kernel/unprivileged_userns_clone"); err == nil && strings.TrimSpace(string(b)) == "0" {
		t.Skip("unprivileged user namespaces disabled (kernel.unprivileged_userns_clone=0)")
	}
}

// startShell starts /bin/sh -c script with attr and env, waits for it to
// say READY and returns its PID; it ends when the test does. It skips t
// when the namespaces cannot be made here.
func startShell(t *testing.T, script string, attr *syscall.SysProcAttr, env ...string) int {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.SysProcAttr = attr
	cmd.Env = append([]string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, env...)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot create the namespaces here: %v", err)
	}
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Wait()
	})
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- strings.TrimSpace(s)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case l := <-line:
		if l != "READY" {
			_ = cmd.Process.Kill()
			t.Skipf("the namespace setup failed here (%q): %s", l, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("setup did not finish: %s", stderr.String())
	}
	return cmd.Process.Pid
}

// unprivileged returns the attributes of a process in a new user and mount
// namespace whose root is the host's nobody (65534).
func unprivileged() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 65534, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 65534, Size: 1}},
		// setuid(0) in the namespace, after the maps are written: the
		// process is then nobody on the host and root in its namespaces.
		Credential: &syscall.Credential{Uid: 0, Gid: 0},
	}
}

// statusOutputs runs memctl status -pid pid as a table and as JSON, checks
// what every hostile case must hold (no secret, no raw escape, no crash,
// exit 3 with the cgroup unknown) and returns the table, the JSON document
// and the table's stderr.
func statusOutputs(t *testing.T, pid int) (table string, doc statusReport, stderr string) {
	t.Helper()
	p := strconv.Itoa(pid)
	table, stderr, code := result(t, memctl(t, nil, "status", "-pid", p))
	js, jsErr, jsCode := result(t, memctl(t, nil, "status", "-json", "-pid", p))
	for _, s := range []string{table, stderr, js, jsErr} {
		assert.NotContains(t, s, secretMarker)
		assert.NotContains(t, s, "\x1b", "no raw ESC")
		assert.NotContains(t, s, "\u009b", "no raw CSI")
		assert.NotContains(t, s, "\x07", "no raw BEL")
		assert.NotContains(t, s, "fatal error")
		assert.NotContains(t, s, "panic")
	}
	assert.Equal(t, exitPartial, code, "some field unknown: exit 3")
	assert.Equal(t, exitPartial, jsCode)
	assert.Empty(t, stderr)
	require.NoError(t, json.Unmarshal([]byte(js), &doc))
	assert.Equal(t, pid, doc.PID)
	assert.Nil(t, doc.Cgroup)
	assert.Contains(t, doc.Unknown, "cgroup")
	assert.NotNil(t, doc.VmRSSBytes, "the other fields are still read")
	assert.Regexp(t, `(?m)^cgroup +unknown: cgroupfs: `, table)
	return table, doc, stderr
}

// TestStatusHostileNamespace is issue 9 item 1: an unprivileged process
// mounts a tmpfs over its /sys/fs/cgroup and puts there, in place of its
// limit file, a symlink to a file only root can read, a symlink to
// /dev/zero, /dev/zero bind-mounted, a FIFO, or a 1 GiB file. Root's
// memctl status -pid must not print the file, crash, or hang; it reports
// the cgroup unknown with the reason.
func TestStatusHostileNamespace(t *testing.T) {
	userNamespaces(t)
	// A file only root can read, in a directory anyone can search (as
	// /etc/shadow): the process can name it, and bind-mount it, but not
	// read it.
	dir, err := os.MkdirTemp("", "memctl-i9-secret-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	secret := filepath.Join(dir, "shadow")
	require.NoError(t, os.WriteFile(secret, []byte(secretMarker+"\n"), 0o600))
	for kind, reason := range map[string]string{
		"secret":      "symlink refused",
		"secret-bind": "file system refused: ",
		"zero":        "symlink refused",
		"zero-bind":   "not a regular file: a character device",
		"fifo":        "not a regular file: a FIFO",
		"huge":        "file system refused: tmpfs (0x1021994), not cgroup (0x27e0eb) or cgroup2 (0x63677270)",
	} {
		t.Run(kind, func(t *testing.T) {
			pid := startShell(t, hostileSetup, unprivileged(), "KIND="+kind, "SECRET="+secret)
			table, doc, _ := statusOutputs(t, pid)
			assert.Contains(t, doc.Unknown["cgroup"], reason)
			assert.Contains(t, doc.Unknown["cgroup"], `"/proc/`+strconv.Itoa(pid)+`/root/`, "the error names the file, quoted")
			assert.Contains(t, table, reason)
		})
	}
}

// TestStatusEscapesInErrors is issue 9 item 2: a mount point whose name
// holds escape sequences (ESC [2J, an OSC title, BEL, the C1 CSI) reaches
// the error about an unreadable file under it: quoted, never raw, in the
// table, the JSON and on stderr.
func TestStatusEscapesInErrors(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a private mount namespace")
	}
	dir, err := os.MkdirTemp("", "memctl-i9-esc-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	for kind, want := range map[string]string{
		"fifo": "not a regular file: a FIFO",
		// On tmpfs, not cgroupfs: refused before it is read. The excerpt of
		// a malformed cgroup file is checked in package cgroupfs.
		"garbage": "file system refused: tmpfs",
		"long":    "file system refused: tmpfs",
	} {
		t.Run(kind, func(t *testing.T) {
			pid := startShell(t, escSetup, &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}, "ESCDIR="+dir, "KIND="+kind)
			table, doc, _ := statusOutputs(t, pid)
			assert.Contains(t, doc.Unknown["cgroup"], `evil\x1b[2J\x1b]0;owned\a\u009bname`)
			assert.Contains(t, doc.Unknown["cgroup"], want)
			assert.Less(t, len(doc.Unknown["cgroup"]), 600, "a short excerpt of the file")
			assert.Contains(t, table, `evil\x1b[2J\x1b]0;owned\a\u009bname`)
		})
	}
}

// TestStatusPartial is issue 9 item 3: a process whose smaps_rollup,
// environ and root cannot be read (here a root process read by nobody;
// "memctl status -pid 1" in a sandbox whose init is not dumpable is the
// same) still shows what can be read, each missing field unknown with the
// reason, and status exits 3.
func TestStatusPartial(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run memctl as another user")
	}
	cmd := exec.Command("/bin/sleep", "60")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	// A copy of the test binary that nobody can run.
	exe, err := os.Executable()
	require.NoError(t, err)
	dir, err := os.MkdirTemp("", "memctl-i9-partial-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	b, err := os.ReadFile(exe)
	require.NoError(t, err)
	cp := filepath.Join(dir, "memctl.test")
	require.NoError(t, os.WriteFile(cp, b, 0o755))

	for _, args := range [][]string{{"-json"}, nil} {
		st := memctl(t, nil, append([]string{"status", "-pid", strconv.Itoa(cmd.Process.Pid)}, args...)...)
		st.Path, st.Args[0] = cp, cp
		st.Dir = dir
		st.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, errOut, code := result(t, st)
		assert.Equal(t, exitPartial, code)
		assert.Empty(t, errOut)
		if args == nil {
			assert.Regexp(t, `(?m)^AnonHugePages +unknown: procfs: open "/proc/\d+/smaps_rollup": permission denied$`, out)
			assert.Regexp(t, `(?m)^VmRSS +\d+ bytes`, out)
			assert.Regexp(t, `(?m)^env +unknown: procfs: open "/proc/\d+/environ": permission denied$`, out)
			continue
		}
		var doc statusReport
		require.NoError(t, json.Unmarshal([]byte(out), &doc))
		assert.NotNil(t, doc.VmRSSBytes, "status is readable")
		assert.NotNil(t, doc.THPEnabled)
		assert.Nil(t, doc.AnonHugePagesBytes)
		assert.Contains(t, doc.Unknown["anon_huge_pages_bytes"], "permission denied")
		assert.Contains(t, doc.Unknown["env"], "permission denied")
		assert.Contains(t, doc.Unknown["cgroup"], "permission denied")
		assert.Contains(t, doc.Unknown["memctl"], "permission denied", "/proc/PID/fd, where the state record is")
		assert.Contains(t, doc.Unknown["pss_bytes"], "permission denied")
		assert.Nil(t, doc.Env)
		assert.Len(t, doc.Unknown, 5)
	}
}

// TestStatusProcessExits is issue 9 item 3, second half: a process that
// exits while status reads it gives one clear error.
func TestStatusProcessExits(t *testing.T) {
	for i := 0; i < 20; i++ {
		cmd := exec.Command("/bin/sleep", "0.0"+strconv.Itoa(i%10))
		require.NoError(t, cmd.Start())
		pid := cmd.Process.Pid
		go func() { _ = cmd.Wait() }()
		out, errOut, code := result(t, memctl(t, nil, "status", "-pid", strconv.Itoa(pid)))
		switch code {
		case exitOK:
			assert.Contains(t, out, "pid ")
		case exitError:
			assert.Empty(t, out)
			assert.Regexp(t, `^memctl: process `+strconv.Itoa(pid)+` (exited while memctl read it|does not exist \(no /proc/\d+\))\n$`, errOut)
		default:
			t.Fatalf("exit %d: %s %s", code, out, errOut)
		}
	}
}

// TestStatusExitedIsOneError checks readStatus directly on a process that
// is reaped between the open of /proc/PID and the end: the pinned directory
// fails every read, and the one error says the process exited.
func TestStatusExitedIsOneError(t *testing.T) {
	cmd := exec.Command("/bin/sleep", "60")
	require.NoError(t, cmd.Start())
	pid := cmd.Process.Pid
	exited := false
	testHookAfterStart = func() {
		if !exited {
			exited = true
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}
	defer func() { testHookAfterStart = nil }()
	_, err := readStatus(pid, false)
	require.Error(t, err)
	assert.Equal(t, "process "+strconv.Itoa(pid)+" exited while memctl read it", err.Error())
}

// TestStatusHybridUsesV1 is issue 10 item 6 on the command side: the
// process's mount namespace has cgroup v2 without the memory controller and
// no v1 memory mount, its v1 memory cgroup has a limit: status reports that
// limit (read in memctl's mount namespace), not "none".
func TestStatusHybridUsesV1(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a private mount namespace")
	}
	g := cgrouptest.New(t, 256<<20)
	if g.Version != 1 {
		t.Skip("needs a v1 memory hierarchy (a hybrid host)")
	}
	v2, err := os.ReadFile("/sys/fs/cgroup/unified/cgroup.controllers")
	if err != nil || strings.Contains(string(v2), "memory") {
		t.Skipf("needs cgroup v2 at /sys/fs/cgroup/unified without the memory controller: %q %v", v2, err)
	}
	script := `set -eu
echo $$ > "$PROCS"
mount --make-rprivate /
umount -l /sys/fs/cgroup/memory
echo READY
read x || true
`
	pid := startShell(t, script, &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}, "PROCS="+filepath.Join(g.Dir, "cgroup.procs"))
	p := strconv.Itoa(pid)
	table, _, code := result(t, memctl(t, nil, "status", "-pid", p))
	require.Equal(t, exitOK, code)
	assert.Regexp(t, `(?m)^memory limit +268435456 bytes \(256\.0 MiB\) from "`+g.Dir+`/memory.limit_in_bytes"$`, table)
	assert.Contains(t, table, "read in memctl's mount namespace")
	js, _, code := result(t, memctl(t, nil, "status", "-json", "-pid", p))
	require.Equal(t, exitOK, code)
	var doc statusReport
	require.NoError(t, json.Unmarshal([]byte(js), &doc))
	require.NotNil(t, doc.Cgroup)
	assert.Equal(t, 1, doc.Cgroup.Version)
	assert.Equal(t, "memctl", doc.Cgroup.View)
	require.NotNil(t, doc.Cgroup.LimitBytes)
	assert.Equal(t, int64(256<<20), *doc.Cgroup.LimitBytes)
}
