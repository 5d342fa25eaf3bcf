package limits

import (
	"bytes"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
)

func init() {
	// v2limit moves itself into the cgroup whose cgroup.procs V2_MOVE_TO
	// names (when set), then reports what cgroupfs.Of(0) and
	// NewMemLimiter find, with the WARN lines of a JSON logger on stderr.
	children["v2limit"] = func() {
		if p := os.Getenv("V2_MOVE_TO"); p != "" {
			if err := os.WriteFile(p, []byte("0"), 0); err != nil {
				childtest.Fail("move to %s: %v", p, err)
			}
		}
		b, _ := os.ReadFile("/proc/self/cgroup")
		childtest.Say("PROC_CGROUP", strings.ReplaceAll(strings.TrimSpace(string(b)), "\n", "; "))
		l, err := cgroupfs.Of(0)
		childtest.Say("CG_BYTES", l.Bytes)
		childtest.Say("CG_FILE", l.File)
		childtest.Say("CG_DIR", l.Dir)
		childtest.Say("CG_ERR", strings.ReplaceAll(fmtErr(err), "\n", "; "))
		_, d, err := NewMemLimiter(MemLimitConfig{Logger: slog.New(slog.NewJSONHandler(os.Stderr, nil)), Refresh: -1})
		childtest.Say("ERR", fmtErr(err))
		childtest.Say("READBACK", debug.SetMemoryLimit(-1))
		childtest.Say("LIMIT", d.MemoryLimit)
		childtest.Say("SOURCE", d.Source)
		childtest.Say("FILE", d.File)
		childtest.Say("UNKNOWN", d.LimitUnknown)
		childtest.Say("REASON", d.Reason)
	}
}

func fmtErr(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// runV2Limit runs the v2limit child with cmd set up by wrap and returns
// its report.
func runV2Limit(t *testing.T, wrap func(cmd *exec.Cmd), env ...string) map[string]string {
	t.Helper()
	cmd := childtest.Command(t, "v2limit", []string{"GOMEMLIMIT", "AUTOMEMLIMIT", declaredLimitEnv, lambdaMemoryEnv}, env...)
	wrap(cmd)
	r, _ := reportAndWarns(t, cmd)
	t.Logf("child: %v", r)
	return r
}

// TestV2WholeTreeNamespace (issue 25, "What fails today" 3, on a real v2
// kernel): a new cgroup namespace rooted at /ns, the host's cgroup2 mount
// kept, the process moved to /ns/pod (so /proc/self/cgroup says
// "0::/pod" and mountinfo shows the mount's root as "/.."-something), the
// 512 MiB limit on /ns/memory.max. memctl said "no cgroup memory limit"
// and left GOMEMLIMIT unset; now the limit is found, on /ns/memory.max,
// and GOMEMLIMIT is set from it. The same with the namespace rooted at
// the process's own cgroup ("0::/", cgrouptest.LayoutWholeTree).
func TestV2WholeTreeNamespace(t *testing.T) {
	parent := cgrouptest.RequireV2(t)
	const limit = 512 << 20
	ns := filepath.Join(parent, "memctl-ns-"+strconv.Itoa(os.Getpid())+"-"+strconv.FormatInt(time.Now().UnixNano(), 10))
	require.NoError(t, os.Mkdir(ns, 0o755))
	pod := filepath.Join(ns, "pod")
	t.Cleanup(func() {
		for _, d := range []string{pod, ns} {
			assert.NoError(t, (&cgrouptest.Child{Dir: d, Version: 2}).Remove())
		}
	})
	require.NoError(t, os.WriteFile(filepath.Join(ns, "memory.max"), []byte(strconv.Itoa(limit)), 0))
	require.NoError(t, os.Mkdir(pod, 0o755)) // no memory controller in /ns's subtree_control: /ns may hold a process
	f, err := os.Open(ns)
	require.NoError(t, err)
	defer f.Close()
	r := runV2Limit(t, func(cmd *exec.Cmd) {
		// Started in /ns in a new cgroup namespace rooted there; the
		// child moves itself to /ns/pod through the host's mount.
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(f.Fd()), Unshareflags: syscall.CLONE_NEWCGROUP}
	}, "V2_MOVE_TO="+filepath.Join(pod, "cgroup.procs"))
	assert.Equal(t, "0::/pod", r["PROC_CGROUP"])
	assert.Equal(t, "<nil>", r["CG_ERR"])
	assert.Equal(t, strconv.Itoa(limit), r["CG_BYTES"])
	assert.Equal(t, filepath.Join(ns, "memory.max"), r["CG_FILE"])
	assert.Equal(t, pod, r["CG_DIR"])
	assert.Equal(t, "cgroup v2", r["SOURCE"])
	assert.Equal(t, strconv.Itoa(limit), r["LIMIT"])
	assert.Equal(t, filepath.Join(ns, "memory.max"), r["FILE"])
	n := childtest.RequireInt(t, r, "READBACK")
	assert.Greater(t, n, int64(limit/2), "GOMEMLIMIT set: 0.9 of the limit less a few MiB")
	assert.LessOrEqual(t, n, int64(limit*9/10))

	g := cgrouptest.NewV2(t, cgrouptest.LayoutWholeTree, limit)
	r = runV2Limit(t, func(cmd *exec.Cmd) { g.Wrap(t, cmd) })
	assert.Equal(t, "0::/", r["PROC_CGROUP"])
	assert.Equal(t, strconv.Itoa(limit), r["CG_BYTES"])
	assert.Equal(t, filepath.Join(g.Top, "memory.max"), r["FILE"])
	assert.Equal(t, "cgroup v2", r["SOURCE"])
}

// TestV2ReadOnlyRemount: cgroup2 remounted read-only in a private cgroup
// namespace (a container without privileges). A limit on the namespace
// root is read through the read-only mount (never "unknown"); a limit
// only above it (pod-level resources, read-only or not) is truly out of
// sight: "unknown", naming MEMCTL_MEMORY_LIMIT as the remedy, and followed
// once declared.
func TestV2ReadOnlyRemount(t *testing.T) {
	cgrouptest.RequireV2(t)
	const limit = 512 << 20
	g := cgrouptest.NewV2(t, cgrouptest.LayoutReadOnly, limit)
	r := runV2Limit(t, func(cmd *exec.Cmd) { g.Wrap(t, cmd) })
	assert.Equal(t, "0::/", r["PROC_CGROUP"])
	assert.Equal(t, "cgroup v2", r["SOURCE"])
	assert.Equal(t, strconv.Itoa(limit), r["LIMIT"])
	assert.Equal(t, "false", r["UNKNOWN"])

	readOnlyPod := cgrouptest.Layout{Name: "readonly-pod", Namespace: true, Remount: true, ReadOnly: true, LimitAbove: true}
	for _, l := range []cgrouptest.Layout{readOnlyPod, cgrouptest.LayoutPod} {
		t.Run(l.Name, func(t *testing.T) { limitAboveNamespace(t, l, limit) })
	}
}

// limitAboveNamespace: a limit set only above the namespace's root, which
// the namespace's own mount cannot show (pod-level resources): "unknown",
// naming MEMCTL_MEMORY_LIMIT as the remedy, GOMEMLIMIT left unset; with
// the variable set (as the downward API writes limits.memory), followed.
func limitAboveNamespace(t *testing.T, l cgrouptest.Layout, limit int64) {
	g := cgrouptest.NewV2(t, l, limit)
	r := runV2Limit(t, func(cmd *exec.Cmd) { g.Wrap(t, cmd) })
	assert.Equal(t, "none", r["SOURCE"])
	assert.Equal(t, "true", r["UNKNOWN"])
	assert.Contains(t, r["REASON"], "unknown")
	assert.Contains(t, r["REASON"], declaredLimitEnv)
	assert.NotContains(t, r["REASON"], "set GOMEMLIMIT")
	assert.Equal(t, strconv.FormatInt(1<<63-1, 10), r["READBACK"])

	r = runV2Limit(t, func(cmd *exec.Cmd) { g.Wrap(t, cmd) }, declaredLimitEnv+"="+strconv.FormatInt(limit, 10))
	assert.Equal(t, "declared", r["SOURCE"])
	assert.Equal(t, strconv.FormatInt(limit, 10), r["LIMIT"])
	assert.Equal(t, "false", r["UNKNOWN"])
}

// TestWholeTreeNamespaceV1: the whole-tree namespace of issue 25 on this
// host's real cgroup v1 memory controller: a child enters a 512 MiB cgroup
// /X, unshares its cgroup namespace there (unshare -C: rooted at /X), keeps
// the host's mounts and moves itself to /X/pod, so that /proc/self/cgroup
// says "memory:/pod" and mountinfo shows the memory mount's root above the
// namespace ("/../.."). The 512 MiB limit on /X is found and GOMEMLIMIT set
// from it (before the fix: "no cgroup memory limit", GOMEMLIMIT unset).
func TestWholeTreeNamespaceV1(t *testing.T) {
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skipf("needs unshare(1) for a cgroup namespace: %v", err)
	}
	const limit = 512 << 20
	g := cgrouptest.New(t, limit)
	if g.Version != 1 {
		t.Skipf("a v1 memory cgroup is needed here, got v%d (the v2 case is TestV2WholeTreeNamespace)", g.Version)
	}
	pod := filepath.Join(g.Dir, "pod")
	require.NoError(t, os.Mkdir(pod, 0o755))
	t.Cleanup(func() { assert.NoError(t, (&cgrouptest.Child{Dir: pod, Version: 1}).Remove()) }) // before g's removal
	cmd := childtest.Command(t, "v2limit", []string{"GOMEMLIMIT", "AUTOMEMLIMIT", declaredLimitEnv, lambdaMemoryEnv}, "V2_MOVE_TO="+filepath.Join(pod, "cgroup.procs"))
	procs := filepath.Join(g.Dir, "cgroup.procs")
	cmd.Args = append([]string{"/bin/sh", "-c", `echo $$ > "$0" && exec "$@"`, procs, unshare, "-C", cmd.Path}, cmd.Args[1:]...)
	cmd.Path = "/bin/sh"
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil && strings.Contains(stderr.String(), "unshare") {
		t.Skipf("no cgroup namespace here: %v: %s", err, stderr.String())
	}
	require.NoError(t, err, stderr.String())
	r := childtest.ParseReport(out)
	t.Logf("child: %v", r)
	if !strings.Contains(r["PROC_CGROUP"], ":memory:/pod") {
		t.Skipf("no cgroup namespace here (unshare -C): /proc/self/cgroup %q", r["PROC_CGROUP"])
	}
	assert.Equal(t, "<nil>", r["CG_ERR"])
	assert.Equal(t, strconv.Itoa(limit), r["CG_BYTES"])
	assert.Equal(t, pod, r["CG_DIR"])
	assert.Equal(t, "cgroup v1", r["SOURCE"])
	assert.Equal(t, strconv.Itoa(limit), r["LIMIT"])
	assert.Equal(t, filepath.Join(g.Dir, "memory.limit_in_bytes"), r["FILE"])
	n := childtest.RequireInt(t, r, "READBACK")
	assert.Greater(t, n, int64(limit/2), "GOMEMLIMIT set: 0.9 of the limit less a few MiB")
	assert.LessOrEqual(t, n, int64(limit*9/10))
}

// TestDetectSandbox: gVisor's two documented signs each give "gVisor"; a
// host kernel's log and no marker give "".
func TestDetectSandbox(t *testing.T) {
	marker, read := gvisorMarker, readKernelLog
	t.Cleanup(func() { gvisorMarker, readKernelLog = marker, read })
	if _, err := os.Stat("/proc/gvisor"); err == nil {
		t.Skip("running in gVisor: the host case cannot be checked here")
	}
	assert.Equal(t, "", detectSandbox(), "this host")

	gvisorMarker = t.TempDir()
	assert.Equal(t, "gVisor", detectSandbox(), "the marker file")

	gvisorMarker = filepath.Join(t.TempDir(), "none")
	gvisorLog := "[    0.000000] Starting gVisor...\n[    0.354495] Daemonizing children...\n[    2.613217] Ready!\n"
	readKernelLog = func(buf []byte) (int, error) { return copy(buf, gvisorLog), nil }
	assert.Equal(t, "gVisor", detectSandbox(), "gVisor's kernel log")
	readKernelLog = func(buf []byte) (int, error) { return copy(buf, "[    0.000000] Linux version 6.1.0\n"), nil }
	assert.Equal(t, "", detectSandbox(), "a host kernel's log")
	readKernelLog = func(buf []byte) (int, error) { return 0, os.ErrPermission }
	assert.Equal(t, "", detectSandbox(), "a log that cannot be read")
	readKernelLog = func(buf []byte) (int, error) { return -1, nil }
	assert.Equal(t, "", detectSandbox(), "a bad count")
}
