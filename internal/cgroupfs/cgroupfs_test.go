package cgroupfs

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgrouptest"
)

// readFixture reads testdata/dir/{cgroup,mountinfo} with testdata/dir/root
// as the root of the mount points.
func readFixture(t *testing.T, dir string) (Limit, error) {
	t.Helper()
	d := filepath.Join("testdata", dir)
	return Read(filepath.Join(d, "cgroup"), filepath.Join(d, "mountinfo"), filepath.Join(d, "root"))
}

func TestReadFixtures(t *testing.T) {
	root := func(dir string, p ...string) string {
		return filepath.Join(append([]string{"testdata", dir, "root"}, p...)...)
	}
	for _, tc := range []struct {
		dir  string
		want Limit
	}{
		{"v1-parent-tighter", Limit{
			Version: 1, Cgroup: "/kubepods/pod1/ctr",
			Dir:   root("v1-parent-tighter", "sys/fs/cgroup/memory/kubepods/pod1/ctr"),
			Bytes: 512 << 20,
			// The parent's 512 MiB wins over the child's 1 GiB; memory.stat
			// says the same and the file that sets it is named.
			File: root("v1-parent-tighter", "sys/fs/cgroup/memory/kubepods/pod1/memory.limit_in_bytes"),
		}},
		{"v1-container-hidden-parent", Limit{
			Version: 1, Cgroup: "/docker/abc",
			Dir:   root("v1-container-hidden-parent", "sys/fs/cgroup/memory"),
			Bytes: 256 << 20,
			File:  root("v1-container-hidden-parent", "sys/fs/cgroup/memory/memory.stat"),
		}},
		{"v2-nested", Limit{
			Version: 2, Cgroup: "/system.slice/app.service",
			Dir:   root("v2-nested", "sys/fs/cgroup/system.slice/app.service"),
			Bytes: 1 << 30,
			File:  root("v2-nested", "sys/fs/cgroup/system.slice/memory.max"),
		}},
		{"v2-max", Limit{
			Version: 2, Cgroup: "/user.slice/user-0.slice/session-1.scope",
			Dir:   root("v2-max", "sys/fs/cgroup/user.slice/user-0.slice/session-1.scope"),
			Bytes: NoLimit,
		}},
		{"hybrid", Limit{
			Version: 1, Cgroup: "/process_api/c9ca",
			Dir:   root("hybrid", "sys/fs/cgroup/memory/process_api/c9ca"),
			Bytes: 256 << 20,
			File:  root("hybrid", "sys/fs/cgroup/memory/process_api/c9ca/memory.limit_in_bytes"),
		}},
		{"hybrid-no-memory", Limit{
			Version: 2, Cgroup: "/x",
			Dir:   root("hybrid-no-memory", "sys/fs/cgroup/unified/x"),
			Bytes: NoLimit,
		}},
		{"v2-escaped-shadowed", Limit{
			Version: 2, Cgroup: "/a",
			Dir:   root("v2-escaped-shadowed", "cg two/a"),
			Bytes: 100 << 20,
			File:  root("v2-escaped-shadowed", "cg two/a/memory.max"),
		}},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			got, err := readFixture(t, tc.dir)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestReadNoCgroup(t *testing.T) {
	for dir, msg := range map[string]string{
		"not-mounted":       "hierarchy not mounted",
		"outside-namespace": "outside this cgroup namespace",
		"no-memory-line":    "neither the memory controller nor a cgroup v2 hierarchy",
	} {
		t.Run(dir, func(t *testing.T) {
			_, err := readFixture(t, dir)
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrNoCgroup)
			assert.Contains(t, err.Error(), msg)
			assert.Regexp(t, "^cgroupfs: ", err.Error())
		})
	}
}

func TestReadMalformed(t *testing.T) {
	for dir, file := range map[string]string{
		"bad-cgroup-line":     "cgroup",
		"bad-cgroup-id":       "cgroup",
		"bad-cgroup-empty":    "cgroup",
		"bad-mountinfo":       "mountinfo",
		"bad-mountinfo-short": "mountinfo",
		"bad-v2-value":        "root/sys/fs/cgroup/a/memory.max",
		"bad-v2-negative":     "root/sys/fs/cgroup/a/memory.max",
		"bad-v1-value":        "root/sys/fs/cgroup/memory/a/memory.limit_in_bytes",
		"bad-v1-missing":      "root/sys/fs/cgroup/memory/a/memory.limit_in_bytes",
		"bad-v1-stat":         "root/sys/fs/cgroup/memory/a/memory.stat",
		"v2-missing-dir":      "root/sys/fs/cgroup/gone",
	} {
		t.Run(dir, func(t *testing.T) {
			_, err := readFixture(t, dir)
			require.Error(t, err)
			assert.Contains(t, err.Error(), filepath.Join("testdata", dir, file), "the error names the file")
			assert.Regexp(t, "^cgroupfs: ", err.Error())
			assert.NotErrorIs(t, err, ErrNoCgroup, "malformed is not 'no cgroup'")
		})
	}
}

func TestReadMissingFiles(t *testing.T) {
	d := t.TempDir()
	_, err := Read(filepath.Join(d, "cgroup"), filepath.Join(d, "mountinfo"), "")
	require.Error(t, err)
	assert.ErrorIs(t, err, os.ErrNotExist)
	assert.Contains(t, err.Error(), filepath.Join(d, "cgroup"))

	_, err = Read("testdata/v2-nested/cgroup", filepath.Join(d, "mountinfo"), "")
	assert.ErrorIs(t, err, os.ErrNotExist)
	assert.Contains(t, err.Error(), filepath.Join(d, "mountinfo"))
}

func TestParseLimit(t *testing.T) {
	for in, want := range map[string]int64{
		"0\n":                   0,
		"4096":                  4096,
		"268435456\n":           256 << 20,
		"9223372036854771712\n": NoLimit, // v1 unset, 4 KiB pages
		"9223372036854710272":   NoLimit, // v1 unset, 64 KiB pages
		"18446744073709551615":  NoLimit,
		"4611686018427387903":   1<<62 - 1,
	} {
		got, err := parseLimit(in, false)
		require.NoError(t, err, "%q", in)
		assert.Equal(t, want, got, "%q", in)
	}
	got, err := parseLimit("max\n", true)
	require.NoError(t, err)
	assert.Equal(t, int64(NoLimit), got)
	for _, in := range []string{"", "max", "-1", "1k", "1.5", "18446744073709551616", "1 2"} {
		_, err := parseLimit(in, false)
		assert.Error(t, err, "%q", in)
	}
	_, err = parseLimit("maximum", true)
	assert.ErrorContains(t, err, `want bytes or "max"`)
}

func TestParseMountinfo(t *testing.T) {
	in := `22 1 0:21 / / rw - ext4 /dev/root rw
35 31 0:32 /docker/x /sys/fs/cgroup/memory rw,nosuid shared:12 master:3 - cgroup cgroup rw,memory
36 31 0:33 / /mnt/with\040space rw - cgroup2 none rw
37 31 0:34 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory,cpu
`
	ms, err := parseMountinfo(strings.NewReader(in), "mi")
	require.NoError(t, err)
	require.Len(t, ms, 2, "ext4 left out, the first memory mount shadowed by the second")
	assert.Equal(t, mount{root: "/", point: "/mnt/with space", fstype: "cgroup2", superOpts: []string{"rw"}}, ms[0])
	assert.Equal(t, "/sys/fs/cgroup/memory", ms[1].point)
	assert.True(t, isV1Memory(ms[1]))

	for _, bad := range []string{
		"22 1 0:21 / / rw ext4 /dev/root rw",
		"22 1 0:21 / - ext4 x rw",
		"x 1 0:21 / / rw - ext4 /dev/root rw",
		"22 1 0:21 root / rw - ext4 /dev/root rw",
		"22 1 0:21 / / rw - ext4",
	} {
		_, err := parseMountinfo(strings.NewReader(bad), "mi")
		assert.ErrorContains(t, err, "cgroupfs: mi: line 1: malformed", "%q", bad)
	}
}

func TestParseCgroup(t *testing.T) {
	v1, v2, err := parseCgroup(strings.NewReader("5:cpu,memory:/a/b\n0::/c\n1:name=systemd:/d:e\n"), "cg")
	require.NoError(t, err)
	assert.Equal(t, "/a/b", v1)
	assert.Equal(t, "/c", v2)
	for _, bad := range []string{"4:memory", "4:memory:a", ":memory:/a", "garbage"} {
		_, _, err := parseCgroup(strings.NewReader(bad), "cg")
		assert.ErrorContains(t, err, "cgroupfs: cg: line 1: malformed", "%q", bad)
	}
}

func TestUnescape(t *testing.T) {
	assert.Equal(t, "a b\tc\\d", unescape(`a\040b\011c\134d`))
	assert.Equal(t, `a\b\04`, unescape(`a\b\04`), "not an octal escape: kept")
	assert.Equal(t, `\999`, unescape(`\999`))
}

func TestAncestors(t *testing.T) {
	assert.Equal(t, []string{"/m/a/b", "/m/a", "/m"}, ancestors("/m/a/b", "/m"))
	assert.Equal(t, []string{"/m"}, ancestors("/m", "/m"))
	assert.Equal(t, []string{"r/m/a", "r/m"}, ancestors("r/m/a", "r/m"))
}

// TestOfSelf reads this process's real cgroup and checks the result against
// the files it names.
func TestOfSelf(t *testing.T) {
	l, err := Of(0)
	if errors.Is(err, errors.ErrUnsupported) || errors.Is(err, ErrNoCgroup) {
		t.Skipf("no memory cgroup here: %v", err)
	}
	require.NoError(t, err)
	t.Logf("%+v", l)
	assert.Contains(t, []int{1, 2}, l.Version)
	assert.DirExists(t, l.Dir)
	other, err := Of(os.Getpid())
	require.NoError(t, err)
	assert.Equal(t, l, other, "Of(own pid) reads the same as Of(0)")
	if l.Bytes == NoLimit {
		assert.Empty(t, l.File)
		return
	}
	assertFileHolds(t, l)
}

// TestOfChildInCgroup starts a process in a real child cgroup with a limit
// and reads that limit back through its PID.
func TestOfChildInCgroup(t *testing.T) {
	g := cgrouptest.New(t, 64<<20)
	cmd := exec.Command("/bin/sleep", "30")
	g.Wrap(cmd)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	// The wrapper shell moves itself into the group, then execs sleep.
	waitInCgroup(t, g.Dir, cmd.Process.Pid)

	l, err := Of(cmd.Process.Pid)
	require.NoError(t, err)
	t.Logf("%+v", l)
	assert.Equal(t, g.Version, l.Version)
	assert.Equal(t, g.Dir, l.Dir)
	assert.Equal(t, int64(64<<20), l.Bytes)
	want := "memory.limit_in_bytes"
	if g.Version == 2 {
		want = "memory.max"
	}
	assert.Equal(t, filepath.Join(g.Dir, want), l.File)
	assertFileHolds(t, l)

	_, err = Of(1 << 30)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "/proc/1073741824/cgroup")
}

// TestOfChildInNestedCgroup puts a process in a real cgroup whose own limit
// (128 MiB) is looser than its parent's (64 MiB): the parent's is the one
// that holds, and its file is named.
func TestOfChildInNestedCgroup(t *testing.T) {
	g := cgrouptest.New(t, 64<<20)
	inner := filepath.Join(g.Dir, "inner")
	file := "memory.limit_in_bytes"
	if g.Version == 2 {
		file = "memory.max"
		require.NoError(t, os.WriteFile(filepath.Join(g.Dir, "cgroup.subtree_control"), []byte("+memory"), 0))
	}
	require.NoError(t, os.Mkdir(inner, 0o755))
	cmd := exec.Command("/bin/sh", "-c", `echo $$ > "$0" && exec /bin/sleep 30`, filepath.Join(inner, "cgroup.procs"))
	t.Cleanup(func() {
		if cmd.Process != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		// Runs before g's cleanup removes the parent.
		require.Eventually(t, func() bool { return os.Remove(inner) == nil }, 5*time.Second, 20*time.Millisecond)
	})
	require.NoError(t, os.WriteFile(filepath.Join(inner, file), []byte("134217728"), 0))
	require.NoError(t, cmd.Start())
	waitInCgroup(t, inner, cmd.Process.Pid)

	l, err := Of(cmd.Process.Pid)
	require.NoError(t, err)
	t.Logf("%+v", l)
	assert.Equal(t, inner, l.Dir)
	assert.Equal(t, int64(64<<20), l.Bytes)
	assert.Equal(t, filepath.Join(g.Dir, file), l.File, "the parent's limit is the tighter one")
	assertFileHolds(t, l)
}

// waitInCgroup waits until pid is listed in dir/cgroup.procs.
func waitInCgroup(t *testing.T, dir string, pid int) {
	t.Helper()
	procs := filepath.Join(dir, "cgroup.procs")
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(procs)
		return err == nil && slices.Contains(strings.Fields(string(b)), strconv.Itoa(pid))
	}, 5*time.Second, 10*time.Millisecond, "pid %d in %s", pid, procs)
}

// assertFileHolds checks that l.File holds l.Bytes.
func assertFileHolds(t *testing.T, l Limit) {
	t.Helper()
	b, err := os.ReadFile(l.File)
	require.NoError(t, err)
	want := strconv.FormatInt(l.Bytes, 10)
	if filepath.Base(l.File) == "memory.stat" {
		assert.Contains(t, string(b), "hierarchical_memory_limit "+want+"\n")
		return
	}
	assert.Equal(t, want, strings.TrimSpace(string(b)))
}
