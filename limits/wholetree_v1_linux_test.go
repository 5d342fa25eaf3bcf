package limits

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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
