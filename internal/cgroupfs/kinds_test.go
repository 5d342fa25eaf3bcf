package cgroupfs

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tree writes a fixture under a temporary directory: cgroup and mountinfo
// (with {{ROOT}} replaced by the directory, escaped as the kernel escapes
// paths) and each file of files (a path relative to the directory); it
// returns the directory.
func tree(t *testing.T, cgroup, mountinfo string, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	esc := strings.NewReplacer(`\`, `\134`, " ", `\040`, "\t", `\011`, "\n", `\012`).Replace(dir)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cgroup), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "mountinfo"), []byte(strings.ReplaceAll(mountinfo, "{{ROOT}}", esc)), 0o644))
	for name, content := range files {
		p := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		if content == "<dir>" {
			require.NoError(t, os.Mkdir(p, 0o755))
			continue
		}
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	}
	return dir
}

func readTree(dir string) (Limit, error) {
	return Read(filepath.Join(dir, "cgroup"), filepath.Join(dir, "mountinfo"), "")
}

// TestMountinfoSplitOnSpaceOnly: the kernel separates mountinfo fields with
// ' ' and escapes only space, tab, newline and backslash; other white space
// (U+3000, U+00A0, a raw '\r') is part of a path, as moby/sys mountinfo and
// the Go runtime read it. strings.Fields split on all of them: an unrelated
// bind mount whose root held U+3000 made the whole read fail, and a '\r' in
// a cgroup2 mount point gave a wrong directory.
func TestMountinfoSplitOnSpaceOnly(t *testing.T) {
	for name, odd := range map[string]string{"U+3000": "\u3000", "U+00A0": "\u00a0", "CR": "\r", "VT": "\v", "FF": "\f"} {
		t.Run(name, func(t *testing.T) {
			dir := tree(t, "0::/app\n",
				"22 1 8:1 / / rw - ext4 /dev/root rw\n"+
					"40 22 8:1 /srv/data"+odd+"x /mnt/b"+odd+"ind rw,relatime - ext4 /dev/root rw\n"+
					"30 22 0:26 / {{ROOT}}/cg"+odd+"2 rw,nosuid shared:4 - cgroup2 cgroup2 rw\n",
				map[string]string{
					"cg" + odd + "2/cgroup.controllers": "memory\n",
					"cg" + odd + "2/app/memory.max":     "268435456\n",
				})
			l, err := readTree(dir)
			require.NoError(t, err)
			assert.Equal(t, int64(256<<20), l.Bytes)
			assert.Equal(t, filepath.Join(dir, "cg"+odd+"2/app/memory.max"), l.File, "the mount point keeps its %s", name)
		})
	}
}

// TestMountinfoFields: what the kernel writes and what it never does.
func TestMountinfoFields(t *testing.T) {
	ok := []string{
		// An empty source (mount -t tmpfs "" /x) leaves two spaces.
		"41 22 0:50 / /x rw - tmpfs  rw",
		// Super options hold raw spaces and backslashes (cifs unc=).
		`31 21 0:23 / /DATA rw - cifs //foo/BLA\040BLA/ rw,unc=\\foo\BLA BLA BLA,uid=1`,
		// Escaped space, tab, newline, backslash in both paths.
		`649 94 259:5 /tmp/a\012b\011c\040d\134e /tmp/a\012b\011c\040d\134e rw - ext4 /dev/x rw`,
	}
	for _, line := range ok {
		_, err := parseMountinfo(strings.NewReader(line+"\n"), "mi")
		assert.NoError(t, err, "%q", line)
	}
	ms, err := parseMountinfo(strings.NewReader(`649 94 0:5 /a\012b /c\040d\134e rw - cgroup2 x rw`+"\n"), "mi")
	require.NoError(t, err)
	assert.Equal(t, []mount{{root: "/a\nb", point: `/c d\e`, fstype: "cgroup2", superOpts: []string{"rw"}}}, ms)
	bad := []string{
		"22 1 8:1 / /cgroup rw - cgroup cgroup",     // no super options (the Go runtime and automaxprocs refuse it too)
		"22 1 8:1 / /cgroup rw -  cgroup cgroup rw", // empty file system type
		"22  1 8:1 / /cgroup rw - cgroup cgroup rw", // two spaces before the separator
		`56 22 0:40 /\1 /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu`,
		`56 22 0:40 / /sys/fs/cgroup/\1 rw - cgroup cgroup rw,cpu`,
		`56 22 0:40 / /sys/fs/cgroup/\777 rw - cgroup cgroup rw,cpu`,
	}
	for _, line := range bad {
		_, err := parseMountinfo(strings.NewReader(line+"\n"), "mi")
		assert.ErrorContains(t, err, "malformed", "%q", line)
	}
}

// TestClimbingCgroupResolved: a cgroup path that climbs out of the cgroup
// namespace ("/../../x": a process that joined a namespace without moving
// into its cgroup) is found through a mount whose root climbs at least as
// far, as the Go runtime resolves it (internal/runtime/cgroup,
// TestParseCPUMount out_of_namespace), and only there.
func TestClimbingCgroupResolved(t *testing.T) {
	const mi = "22 1 8:1 / / rw - ext4 /dev/root rw\n" +
		"1243 61 0:26 /../../.. {{ROOT}}/mnt rw,nosuid shared:4 - cgroup2 cgroup2 rw\n" +
		"29 22 0:26 /../../../.. {{ROOT}}/cg rw,nosuid shared:4 - cgroup2 cgroup2 rw\n"
	files := map[string]string{
		"cg/cgroup.controllers":     "memory\n",
		"cg/init.scope/memory.max":  "134217728\n",
		"mnt/cgroup.controllers":    "memory\n",
		"mnt/init.scope/memory.max": "1\n", // must not be read: /mnt's root does not reach /../../../..
	}
	dir := tree(t, "0::/../../../../init.scope\n", mi, files)
	l, err := readTree(dir)
	require.NoError(t, err)
	assert.Equal(t, int64(128<<20), l.Bytes)
	assert.Equal(t, filepath.Join(dir, "cg/init.scope"), l.Dir)

	dir = tree(t, "0::/../../../..\n", mi, map[string]string{"cg/cgroup.controllers": "memory\n", "cg/memory.max": "max\n"})
	l, err = readTree(dir)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, "cg"), l.Dir, "the process in the mount's root cgroup")

	// No mount root climbs as far: outside the namespace, ErrNoCgroup.
	dir = tree(t, "0::/../../x\n", "29 22 0:26 / {{ROOT}}/cg rw - cgroup2 cgroup2 rw\n30 22 0:26 /.. {{ROOT}}/up rw - cgroup2 cgroup2 rw\n",
		map[string]string{"cg/cgroup.controllers": "memory\n", "cg/x/memory.max": "1\n"})
	_, err = readTree(dir)
	require.ErrorIs(t, err, ErrNoCgroup)
	assert.ErrorContains(t, err, "outside this cgroup namespace")

	// v1 the same way.
	dir = tree(t, "4:memory:/../ctr\n", "35 22 0:32 /.. {{ROOT}}/memory rw - cgroup cgroup rw,memory\n",
		map[string]string{"memory/ctr/memory.limit_in_bytes": "67108864\n", "memory/memory.limit_in_bytes": "9223372036854771712\n"})
	l, err = readTree(dir)
	require.NoError(t, err)
	assert.Equal(t, int64(64<<20), l.Bytes)
}

// TestSeveralMountsOfOneHierarchy: every mount that holds the cgroup is
// read and the tightest limit kept. The first mount here is a bind mount of
// the container's own cgroup; the second shows the pod above it, whose
// limit only it can show.
func TestSeveralMountsOfOneHierarchy(t *testing.T) {
	for _, v := range []struct {
		name, cgroup, mi string
		files            map[string]string
	}{
		{"v2", "0::/kubepods/pod1/ctr\n",
			"30 22 0:26 /kubepods/pod1/ctr {{ROOT}}/a rw - cgroup2 cgroup2 rw\n31 22 0:26 / {{ROOT}}/b rw - cgroup2 cgroup2 rw\n",
			map[string]string{
				"a/cgroup.controllers": "memory\n", "a/memory.max": "max\n",
				"b/cgroup.controllers": "memory\n", "b/kubepods/pod1/ctr/memory.max": "max\n", "b/kubepods/pod1/memory.max": "536870912\n",
			}},
		{"v1", "4:memory:/kubepods/pod1/ctr\n",
			"30 22 0:26 /kubepods/pod1/ctr {{ROOT}}/a rw - cgroup cgroup rw,memory\n31 22 0:26 / {{ROOT}}/b rw - cgroup cgroup rw,memory\n",
			map[string]string{
				"a/memory.limit_in_bytes":                   "9223372036854771712\n",
				"b/kubepods/pod1/ctr/memory.limit_in_bytes": "9223372036854771712\n", "b/kubepods/pod1/memory.limit_in_bytes": "536870912\n",
				"b/kubepods/memory.limit_in_bytes": "9223372036854771712\n", "b/memory.limit_in_bytes": "9223372036854771712\n",
			}},
	} {
		t.Run(v.name, func(t *testing.T) {
			dir := tree(t, v.cgroup, v.mi, v.files)
			l, err := readTree(dir)
			require.NoError(t, err)
			assert.Equal(t, int64(512<<20), l.Bytes)
			assert.Equal(t, filepath.Join(dir, "b/kubepods/pod1", filepath.Base(l.File)), l.File)
			assert.Equal(t, filepath.Join(dir, "a"), l.Dir, "Dir through the first mount")
			assert.False(t, l.TopNotRoot, "the second mount shows the root")
		})
	}
}

// TestControllersReadError: cgroup.controllers that exists but cannot be
// read (EACCES from an LSM; here a directory in its place, as root passes
// every permission check) is an error that names the file, not "no cgroup".
func TestControllersReadError(t *testing.T) {
	dir := tree(t, "0::/app\n", "30 22 0:26 / {{ROOT}}/cg rw - cgroup2 cgroup2 rw\n",
		map[string]string{"cg/cgroup.controllers": "<dir>", "cg/app/memory.max": "268435456\n"})
	_, err := readTree(dir)
	require.Error(t, err)
	assert.False(t, errors.Is(err, ErrNoCgroup), "%v", err)
	assert.ErrorContains(t, err, filepath.Join(dir, "cg/cgroup.controllers"))
}

// TestTopNotRoot: the top of a private cgroup namespace has a memory.max
// (the real root never has one): a limit may be set above it.
func TestTopNotRoot(t *testing.T) {
	mi := "30 22 0:26 / {{ROOT}}/cg rw - cgroup2 cgroup2 rw\n"
	dir := tree(t, "0::/\n", mi, map[string]string{"cg/cgroup.controllers": "memory\n", "cg/memory.max": "max\n", "cg/memory.high": "max\n"})
	l, err := readTree(dir)
	require.NoError(t, err)
	assert.Equal(t, int64(NoLimit), l.Bytes)
	assert.True(t, l.TopNotRoot)

	dir = tree(t, "0::/app\n", mi, map[string]string{"cg/cgroup.controllers": "memory\n", "cg/app/memory.max": "max\n"})
	l, err = readTree(dir)
	require.NoError(t, err)
	assert.Equal(t, int64(NoLimit), l.Bytes)
	assert.False(t, l.TopNotRoot, "a real root: no memory.max at the top")
}

// TestBadHighKeepsMax: a malformed memory.high is kept aside (HighErr) and
// memory.max still read; a malformed memory.max is an error.
func TestBadHighKeepsMax(t *testing.T) {
	mi := "30 22 0:26 / {{ROOT}}/cg rw - cgroup2 cgroup2 rw\n"
	dir := tree(t, "0::/app\n", mi, map[string]string{"cg/cgroup.controllers": "memory\n", "cg/app/memory.max": "536870912\n", "cg/app/memory.high": "lots\n"})
	l, err := readTree(dir)
	require.NoError(t, err)
	assert.Equal(t, int64(512<<20), l.Max)
	assert.Equal(t, int64(512<<20), l.Bytes)
	assert.Equal(t, int64(NoLimit), l.High)
	require.Error(t, l.HighErr)
	assert.Contains(t, l.HighErr.Error(), `malformed limit "lots"`)
	assert.Contains(t, l.HighErr.Error(), "memory.high")
}

// TestCgroupNameEndsInCR (attack on issue 18): a cgroup whose name ends in
// '\r' is "0::/app\r" in /proc/self/cgroup (names are not escaped there).
// bufio.ScanLines dropped the '\r', and the limit of the sibling "app" was
// read instead (256 MiB for 128 MiB).
func TestCgroupNameEndsInCR(t *testing.T) {
	for _, tc := range []struct{ cgroup, mountinfo string }{
		{"0::/app\r\n", "30 22 0:26 / {{ROOT}}/cg rw - cgroup2 cgroup2 rw\n"},
		{"4:memory:/app\r\n", "30 22 0:26 / {{ROOT}}/cg rw - cgroup cgroup rw,memory\n"},
	} {
		dir := tree(t, tc.cgroup, tc.mountinfo, map[string]string{
			"cg/cgroup.controllers":          "memory\n",
			"cg/app/memory.max":              "268435456\n",
			"cg/app\r/memory.max":            "134217728\n",
			"cg/app/memory.limit_in_bytes":   "268435456\n",
			"cg/app\r/memory.limit_in_bytes": "134217728\n",
			"cg/memory.limit_in_bytes":       "9223372036854771712\n",
		})
		l, err := readTree(dir)
		require.NoError(t, err, "%q", tc.cgroup)
		assert.Equal(t, int64(128<<20), l.Bytes, "%q", tc.cgroup)
		assert.Equal(t, "/app\r", l.Cgroup)
	}
}

// TestCgroupDeleted (attack on issue 18): the kernel appends " (deleted)"
// to the v2 line of a task whose cgroup was removed (an exiting task,
// proc_cgroup_show). That is no cgroup to read, said as such, not an open
// error of a directory named "app (deleted)"; a live cgroup whose name
// ends so is still read.
func TestCgroupDeleted(t *testing.T) {
	mi := "30 22 0:26 / {{ROOT}}/cg rw - cgroup2 cgroup2 rw\n"
	dir := tree(t, "0::/app (deleted)\n", mi, map[string]string{"cg/cgroup.controllers": "memory\n", "cg/app/memory.max": "268435456\n"})
	_, err := readTree(dir)
	require.ErrorIs(t, err, ErrNoCgroup)
	assert.ErrorContains(t, err, `cgroup "/app" was removed`)

	dir = tree(t, "0::/app (deleted)\n", mi, map[string]string{"cg/cgroup.controllers": "memory\n", "cg/app (deleted)/memory.max": "268435456\n"})
	l, err := readTree(dir)
	require.NoError(t, err)
	assert.Equal(t, int64(256<<20), l.Bytes)
}

// TestCgroupLineTwice (attack on issue 18): the kernel writes one line a
// hierarchy; a second v2 line, or a second line for the memory controller,
// was taken silently (the last won). It is malformed.
func TestCgroupLineTwice(t *testing.T) {
	for _, cg := range []string{"0::/app\n0::/other\n", "4:memory:/app\n5:memory,cpu:/other\n0::/\n"} {
		_, _, err := parseCgroupFor([]byte(cg), "cgroup", "memory")
		require.Error(t, err, "%q", cg)
		assert.ErrorContains(t, err, "line 2: malformed, a second")
		assert.False(t, errors.Is(err, ErrNoCgroup))
	}
}

// TestSeveralMountsOneGone (attack on issue 18): of two mounts of the same
// v2 hierarchy, one is not there when read (over-mounted at a parent
// directory, a stale bind mount whose directory is gone): mountinfo still
// lists it. Reading every mount made that one's "no such file" fail the
// whole read, first or second; the mounts that can be read are used.
func TestSeveralMountsOneGone(t *testing.T) {
	good := "30 22 0:26 / {{ROOT}}/cg rw - cgroup2 cgroup2 rw\n"
	gone := "31 22 0:26 / {{ROOT}}/gone/cg rw - cgroup2 cgroup2 rw\n"
	files := map[string]string{"cg/cgroup.controllers": "memory\n", "cg/app/memory.max": "268435456\n"}
	for name, mi := range map[string]string{"gone second": good + gone, "gone first": gone + good} {
		t.Run(name, func(t *testing.T) {
			dir := tree(t, "0::/app\n", mi, files)
			l, err := readTree(dir)
			require.NoError(t, err)
			assert.Equal(t, int64(256<<20), l.Bytes)
			assert.Equal(t, filepath.Join(dir, "cg/app"), l.Dir)
		})
	}
	// None there: the first mount's error, naming its directory.
	dir := tree(t, "0::/app\n", gone, nil)
	_, err := readTree(dir)
	require.ErrorIs(t, err, fs.ErrNotExist)
	assert.ErrorContains(t, err, filepath.Join(dir, "gone/cg"))
}

// cgroupDir returns cgroupDirs' first directory and mount point.
func cgroupDir(mounts []mount, cg string, match func(mount) bool, root string) (dir, top string, err error) {
	cands, err := cgroupDirs(mounts, cg, match, root)
	if err != nil {
		return "", "", err
	}
	return cands[0].dir, cands[0].top, nil
}
