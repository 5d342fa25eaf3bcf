package cgroupfs

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readTreePID is readTree for a process whose PID is pid (a fixture's
// cgroup.procs lists it), as Of gives the PID of /proc/PID/cgroup.
func readTreePID(dir string, pid int) (Limit, error) {
	s, err := openSource(filepath.Join(dir, "cgroup"), filepath.Join(dir, "mountinfo"), "")
	if err != nil {
		return Limit{}, err
	}
	defer s.close()
	s.pid = pid
	return s.read()
}

// wholeTreeMount is a cgroup2 mount made in the host's cgroup namespace,
// as a process in a newer cgroup namespace sees it: its root lies root
// levels above the namespace's root ("/.." for one).
func wholeTreeMount(root string) string {
	return "30 22 0:26 " + root + " {{ROOT}}/cg rw,nsdelegate - cgroup2 cgroup2 rw\n"
}

// TestWholeTreeNamespace (issue 25, "What fails today" 3): a new cgroup
// namespace whose mount namespace kept the host's cgroup2 mount. The
// process is in /ns/pod, the namespace's root is /ns, /proc/self/cgroup
// says "0::/pod" and mountinfo shows the mount's root as "/..": no mount
// root is a prefix of "/pod", and the 512 MiB limit on /ns/memory.max was
// "no cgroup memory limit". The cgroup is found under the mount by the
// PID its cgroup.procs lists, and every limit up to the mount counts; a
// cgroup of the same name elsewhere (/other/pod) is not taken.
func TestWholeTreeNamespace(t *testing.T) {
	const pid = 4242
	procs := strconv.Itoa(pid) + "\n"
	dir := tree(t, "0::/pod\n", wholeTreeMount("/.."), map[string]string{
		"cg/cgroup.controllers":      "memory\n",
		"cg/ns/memory.max":           "536870912\n",
		"cg/ns/pod/memory.max":       "max\n",
		"cg/ns/pod/cgroup.procs":     "1\n" + procs + "77\n",
		"cg/other/memory.max":        "max\n",
		"cg/other/pod/memory.max":    "67108864\n",
		"cg/other/pod/cgroup.procs":  "42\n424\n42420\n",
		"cg/init.scope/cgroup.procs": "1\n",
	})
	l, err := readTreePID(dir, pid)
	require.NoError(t, err)
	assert.Equal(t, 2, l.Version)
	assert.Equal(t, filepath.Join(dir, "cg/ns/pod"), l.Dir)
	assert.Equal(t, "/pod", l.Cgroup)
	assert.Equal(t, int64(512<<20), l.Bytes)
	assert.Equal(t, filepath.Join(dir, "cg/ns/memory.max"), l.File)
	assert.False(t, l.TopNotRoot, "the mount's top is the hierarchy's root")
	assert.Equal(t, []Bound{{512 << 20, filepath.Join(dir, "cg/ns/memory.max")}}, l.Bounds)
}

// TestWholeTreeNamespaceDeeper: a container whose cgroup namespace's root
// is its own cgroup (/kubepods/podA/ctr, "0::/"), the host's mount kept
// (root "/../../.."): the pod's limit and the container's both count,
// three levels searched.
func TestWholeTreeNamespaceDeeper(t *testing.T) {
	const pid = 99
	dir := tree(t, "0::/\n", wholeTreeMount("/../../.."), map[string]string{
		"cg/kubepods/memory.max":                   "max\n",
		"cg/kubepods/podA/memory.max":              "268435456\n",
		"cg/kubepods/podA/ctr/memory.max":          "536870912\n",
		"cg/kubepods/podA/ctr/cgroup.procs":        "99\n",
		"cg/kubepods/podA/pause/cgroup.procs":      "9\n",
		"cg/kubepods/podB/ctr/cgroup.procs":        "990\n",
		"cg/system.slice/a.service/x/cgroup.procs": "1\n",
	})
	l, err := readTreePID(dir, pid)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, "cg/kubepods/podA/ctr"), l.Dir)
	assert.Equal(t, int64(256<<20), l.Bytes, "the pod's limit, above the namespace, counts")
	assert.Len(t, l.Bounds, 2)

	// A cgroup that climbs less than the mount's root: "/../pod" (the
	// process one level outside the namespace) under "/../../..".
	dir = tree(t, "0::/../ctr\n", wholeTreeMount("/../../.."), map[string]string{
		"cg/kubepods/podA/memory.max":       "268435456\n",
		"cg/kubepods/podA/ctr/cgroup.procs": "99\n",
	})
	l, err = readTreePID(dir, pid)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, "cg/kubepods/podA/ctr"), l.Dir)
	assert.Equal(t, int64(256<<20), l.Bytes)
}

// TestWholeTreeNamespaceUnseen: where the process's cgroup cannot be
// found under such a mount, the limit is unknown (ErrUnseen, which also
// matches ErrNoCgroup), never "no limit", and the error says why. Hostile
// and malformed input (two cgroups listing the PID, a cgroup.procs of
// garbage, a mount root with a name after its "..", a tree too large to
// search) is an error of the same kind, never a guess.
func TestWholeTreeNamespaceUnseen(t *testing.T) {
	const pid = 4242
	for _, tc := range []struct {
		name, root string
		pid        int
		files      map[string]string
		want       string
	}{
		{"no PID known", "/..", 0, map[string]string{"cg/ns/pod/cgroup.procs": "4242\n"}, "PID is not known"},
		{"no cgroup lists the PID", "/..", pid, map[string]string{"cg/ns/pod/cgroup.procs": "42\n", "cg/ns/memory.max": "536870912\n"}, "lists PID 4242"},
		{"two cgroups list the PID", "/..", pid, map[string]string{"cg/a/pod/cgroup.procs": "4242\n", "cg/b/pod/cgroup.procs": "4242\n"}, "ambiguous"},
		{"garbage cgroup.procs", "/..", pid, map[string]string{"cg/ns/pod/cgroup.procs": "x4242\n4242x\n\x00\n"}, "lists PID 4242"},
		{"sibling root", "/../other", pid, map[string]string{"cg/ns/pod/cgroup.procs": "4242\n"}, "outside the mounted part"},
		{"cgroup.procs a directory", "/..", pid, map[string]string{"cg/ns/pod/cgroup.procs/x": "4242\n"}, "lists PID 4242"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := tree(t, "0::/pod\n", wholeTreeMount(tc.root), tc.files)
			_, err := readTreePID(dir, tc.pid)
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrUnseen)
			assert.ErrorIs(t, err, ErrNoCgroup)
			assert.ErrorContains(t, err, tc.want)
		})
	}
	t.Run("too many cgroups", func(t *testing.T) {
		prev := maxSearch
		maxSearch = 64
		t.Cleanup(func() { maxSearch = prev })
		files := map[string]string{}
		for i := 0; i <= maxSearch; i++ {
			files["cg/d"+strconv.Itoa(i)] = "<dir>"
		}
		dir := tree(t, "0::/pod\n", wholeTreeMount("/.."), files)
		_, err := readTreePID(dir, pid)
		require.Error(t, err)
		assert.ErrorIs(t, err, ErrUnseen)
		assert.ErrorContains(t, err, "more than")
	})
}

// TestClimbs: the ".." prefix of a cgroup path or mount root.
func TestClimbs(t *testing.T) {
	for in, want := range map[string]string{"/": "0 /", "/..": "1 /", "/../..": "2 /", "/../x": "1 /x", "/..x": "0 /..x", "/../../a/b": "2 /a/b"} {
		n, rest := climbs(in)
		assert.Equal(t, want, strconv.Itoa(n)+" "+rest, in)
	}
	assert.True(t, strings.HasPrefix(wholeTreeMount("/.."), "30 "))
}

// TestWholeTreeNamespaceMoved: the directory found is remembered for the
// next read (a refresh), and checked again: a process moved to another
// cgroup is found there, not at the remembered place.
func TestWholeTreeNamespaceMoved(t *testing.T) {
	const pid = 5151
	dir := tree(t, "0::/pod\n", wholeTreeMount("/.."), map[string]string{
		"cg/a/memory.max": "536870912\n", "cg/a/pod/cgroup.procs": "5151\n",
		"cg/b/memory.max": "268435456\n", "cg/b/pod/cgroup.procs": "1\n",
	})
	l, err := readTreePID(dir, pid)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, "cg/a/pod"), l.Dir)
	l, err = readTreePID(dir, pid)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, "cg/a/pod"), l.Dir, "again")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cg/a/pod/cgroup.procs"), []byte("1\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cg/b/pod/cgroup.procs"), []byte("5151\n"), 0o644))
	l, err = readTreePID(dir, pid)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, "cg/b/pod"), l.Dir, "moved")
	assert.Equal(t, int64(256<<20), l.Bytes)
}
