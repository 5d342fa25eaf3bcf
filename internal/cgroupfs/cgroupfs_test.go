package cgroupfs

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/safefs"
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
			High: NoLimit,
		}},
		{"v1-container-hidden-parent", Limit{
			Version: 1, Cgroup: "/docker/abc",
			Dir:   root("v1-container-hidden-parent", "sys/fs/cgroup/memory"),
			Bytes: 256 << 20,
			File:  root("v1-container-hidden-parent", "sys/fs/cgroup/memory/memory.stat"),
			High:  NoLimit,
		}},
		{"v2-nested", Limit{
			Version: 2, Cgroup: "/system.slice/app.service",
			Dir:   root("v2-nested", "sys/fs/cgroup/system.slice/app.service"),
			Bytes: 1 << 30,
			File:  root("v2-nested", "sys/fs/cgroup/system.slice/memory.max"),
			High:  NoLimit,
		}},
		{"v2-max", Limit{
			Version: 2, Cgroup: "/user.slice/user-0.slice/session-1.scope",
			Dir:   root("v2-max", "sys/fs/cgroup/user.slice/user-0.slice/session-1.scope"),
			Bytes: NoLimit, High: NoLimit,
		}},
		{"hybrid", Limit{
			Version: 1, Cgroup: "/process_api/c9ca",
			Dir:   root("hybrid", "sys/fs/cgroup/memory/process_api/c9ca"),
			Bytes: 256 << 20,
			File:  root("hybrid", "sys/fs/cgroup/memory/process_api/c9ca/memory.limit_in_bytes"),
			High:  NoLimit,
		}},
		{"v2-memory-high", Limit{
			Version: 2, Cgroup: "/kubepods.slice/pod1/ctr",
			Dir: root("v2-memory-high", "sys/fs/cgroup/kubepods.slice/pod1/ctr"),
			// memory.high 1400 MiB of the container is under memory.max
			// 1600 MiB of the pod: the kernel throttles from 1400 MiB on.
			Bytes: 1468006400,
			File:  root("v2-memory-high", "sys/fs/cgroup/kubepods.slice/pod1/ctr/memory.high"),
			// Each apart: the hard limit is the pod's memory.max.
			Max: 1677721600, MaxFile: root("v2-memory-high", "sys/fs/cgroup/kubepods.slice/pod1/memory.max"),
			High: 1468006400, HighFile: root("v2-memory-high", "sys/fs/cgroup/kubepods.slice/pod1/ctr/memory.high"),
		}},
		{"v2-high-equal", Limit{
			Version: 2, Cgroup: "/a",
			Dir:   root("v2-high-equal", "sys/fs/cgroup/a"),
			Bytes: 512 << 20,
			File:  root("v2-high-equal", "sys/fs/cgroup/a/memory.max"), // the hard limit is named on a tie
			High:  512 << 20, HighFile: root("v2-high-equal", "sys/fs/cgroup/a/memory.high"),
		}},
		{"v2-escaped-shadowed", Limit{
			Version: 2, Cgroup: "/a",
			Dir:   root("v2-escaped-shadowed", "cg two/a"),
			Bytes: 100 << 20,
			File:  root("v2-escaped-shadowed", "cg two/a/memory.max"),
			High:  NoLimit,
		}},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			got, err := readFixture(t, tc.dir)
			require.NoError(t, err)
			if tc.want.MaxFile == "" && tc.want.Max == 0 {
				// Max is Bytes where no memory.high is tighter.
				tc.want.Max, tc.want.MaxFile = tc.want.Bytes, tc.want.File
			}
			// Bounds hold every hard limit; the smallest is Max.
			bounds := got.Bounds
			got.Bounds = nil
			assert.Equal(t, tc.want, got)
			if got.Max == NoLimit {
				assert.Empty(t, bounds)
			} else {
				assert.Contains(t, bounds, Bound{got.Max, got.MaxFile})
				for _, b := range bounds {
					assert.GreaterOrEqual(t, b.Bytes, got.Max)
				}
			}
			if tc.dir == "v1-parent-tighter" {
				assert.Equal(t, []Bound{
					{1 << 30, root(tc.dir, "sys/fs/cgroup/memory/kubepods/pod1/ctr/memory.limit_in_bytes")},
					{512 << 20, root(tc.dir, "sys/fs/cgroup/memory/kubepods/pod1/memory.limit_in_bytes")},
				}, bounds, "nearest first")
			}
		})
	}
}

func TestReadNoCgroup(t *testing.T) {
	for dir, msg := range map[string]string{
		"not-mounted":       "hierarchy not mounted",
		"outside-namespace": "outside this cgroup namespace",
		"no-memory-line":    "neither the memory controller nor a cgroup v2 hierarchy",
		// v2 of a hybrid host (cgroup.controllers captured from one) has
		// no memory controller: not a "no limit" answer.
		"hybrid-no-memory": "no memory controller in cgroup v2",
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
	// Another mount's root need not be a path: a bind-mounted namespace
	// file's (this host's line, ip netns / CNI).
	_, err = parseMountinfo(strings.NewReader(in+"66 46 0:4 net:[4026531833] /run/netns/x rw - nsfs nsfs rw\n"), "mi")
	require.NoError(t, err)
	assert.Equal(t, mount{root: "/", point: "/mnt/with space", fstype: "cgroup2", superOpts: []string{"rw"}}, ms[0])
	assert.Equal(t, "/sys/fs/cgroup/memory", ms[1].point)
	assert.True(t, isV1Memory(ms[1]))

	for _, bad := range []string{
		"22 1 0:21 / / rw ext4 /dev/root rw",
		"22 1 0:21 / - ext4 x rw",
		"x 1 0:21 / / rw - ext4 /dev/root rw",
		"22 1 0:21 root /sys/fs/cgroup rw - cgroup2 cgroup2 rw", // a cgroup mount's root is a path
		"22 1 0:21 / root rw - ext4 /dev/root rw",               // every mount point is one
		"22 1 0:21 / / rw - ext4",
	} {
		_, err := parseMountinfo(strings.NewReader(bad), "mi")
		assert.ErrorContains(t, err, "cgroupfs: mi: line 1: malformed", "%q", bad)
	}
}

func TestParseCgroup(t *testing.T) {
	v1, v2, err := parseCgroupFor([]byte("5:cpu,memory:/a/b\n0::/c\n1:name=systemd:/d:e\n"), "cg", "memory")
	require.NoError(t, err)
	assert.Equal(t, "/a/b", v1)
	assert.Equal(t, "/c", v2)
	for _, bad := range []string{"4:memory", "4:memory:a", ":memory:/a", "garbage"} {
		_, _, err := parseCgroupFor([]byte(bad), "cg", "memory")
		assert.ErrorContains(t, err, "cgroupfs: cg: line 1: malformed", "%q", bad)
	}
}

func TestUnescape(t *testing.T) {
	got, err := unescape(`a\040b\011c\134d\012`)
	require.NoError(t, err)
	assert.Equal(t, "a b\tc\\d\n", got)
	got, err = unescape("a\rb\u00a0c\u3000d")
	require.NoError(t, err)
	assert.Equal(t, "a\rb\u00a0c\u3000d", got, "the kernel escapes only space, tab, newline and backslash")
	// The kernel escapes every backslash: one that starts no octal
	// escape of a byte is not the kernel's (the Go runtime refuses it
	// too, internal/runtime/cgroup errInvalidEscape).
	for _, bad := range []string{`a\b\04`, `\999`, `\400`, `x\`, `\04`} {
		_, err := unescape(bad)
		assert.Error(t, err, "%q", bad)
	}
}

func TestAncestors(t *testing.T) {
	assert.Equal(t, []string{"/m/a/b", "/m/a", "/m"}, ancestors("/m/a/b", "/m"))
	assert.Equal(t, []string{"/m"}, ancestors("/m", "/m"))
	assert.Equal(t, []string{"r/m/a", "r/m"}, ancestors("r/m/a", "r/m"))
}

// TestReadDotDot: a ".." in a mount point, in a mount root after a name, or
// in a cgroup path after a name would take Dir outside the root Read was
// given; the kernel never writes one there, so it is malformed, and the
// error names the file. A leading ".." is the kernel's way to show what
// lies outside the reader's cgroup namespace: no cgroup, not malformed.
func TestReadDotDot(t *testing.T) {
	for _, tc := range []struct {
		name, cgroup, mountinfo string
		bad                     string // the file the error names; "" for ErrNoCgroup
	}{
		{"mount point climbs", "0::/\n", "1 0 0:1 / /../outside rw - cgroup2 cgroup2 rw\n", "mountinfo"},
		{"mount point climbs after a name", "0::/\n", "1 0 0:1 / /sys/fs/cgroup/../../outside rw - cgroup2 cgroup2 rw\n", "mountinfo"},
		{"mount point with a dot", "0::/\n", "1 0 0:1 / /sys/./fs rw - cgroup2 cgroup2 rw\n", "mountinfo"},
		{"escaped dots in the mount point", "0::/\n", `1 0 0:1 / /\056\056/outside rw - cgroup2 cgroup2 rw` + "\n", "mountinfo"},
		{"v1 mount point climbs", "4:memory:/\n", "1 0 0:1 / /../outside rw - cgroup cgroup rw,memory\n", "mountinfo"},
		{"non-cgroup line", "0::/\n", "1 0 0:1 / /../x rw - ext4 /dev/sda rw\n2 0 0:2 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", "mountinfo"},
		{"mount root climbs after a name", "0::/a\n", "1 0 0:1 /a/../.. /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", "mountinfo"},
		{"cgroup climbs after a name", "0::/a/../../outside\n", "1 0 0:1 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", "cgroup"},
		{"cgroup with a dot", "0::/a/./b\n", "1 0 0:1 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", "cgroup"},
		{"v1 cgroup climbs after a name", "4:memory:/a/../../../outside\n", "1 0 0:1 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n", "cgroup"},
		{"cgroup outside the namespace", "0::/../../x\n", "1 0 0:1 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", ""},
		{"mount root outside the namespace", "0::/\n", "1 0 0:1 /.. /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			root := filepath.Join(dir, "root")
			for _, d := range []string{"root/sys/fs/cgroup/a/b", "root/sys/fs/cgroup/memory", "outside"} {
				require.NoError(t, os.MkdirAll(filepath.Join(dir, d), 0o755))
			}
			require.NoError(t, os.WriteFile(filepath.Join(dir, "outside", "memory.max"), []byte("12345\n"), 0o644))
			require.NoError(t, os.WriteFile(filepath.Join(dir, "outside", "memory.limit_in_bytes"), []byte("12345\n"), 0o644))
			cf, mf := filepath.Join(dir, "cgroup"), filepath.Join(dir, "mountinfo")
			require.NoError(t, os.WriteFile(cf, []byte(tc.cgroup), 0o644))
			require.NoError(t, os.WriteFile(mf, []byte(tc.mountinfo), 0o644))

			l, err := Read(cf, mf, root)
			require.Error(t, err, "Read returned %+v", l)
			assert.Equal(t, Limit{}, l)
			assert.Regexp(t, "^cgroupfs: ", err.Error())
			if tc.bad == "" {
				assert.ErrorIs(t, err, ErrNoCgroup)
				return
			}
			assert.NotErrorIs(t, err, ErrNoCgroup, "malformed is not 'no cgroup'")
			assert.Contains(t, err.Error(), filepath.Join(dir, tc.bad)+": line ", "the error names the file")
			assert.Contains(t, err.Error(), "malformed")
		})
	}
}

func TestCleanPath(t *testing.T) {
	for p, want := range map[string]bool{
		"/": true, "/a": true, "/a/b": true, "/a..b/.c": true, "/...": true,
		"/..": false, "/../a": false, "/a/..": false, "/.": false, "/a/./b": false,
	} {
		assert.Equal(t, want, cleanPath(p, false), "%q", p)
	}
	for p, want := range map[string]bool{
		"/..": true, "/../..": true, "/../../a/b": true,
		"/a/..": false, "/../a/../b": false, "/../.": false,
	} {
		assert.Equal(t, want, cleanPath(p, true), "%q up", p)
	}
}

// TestMalformedExcerpt: a malformed limit file's content reaches the error
// as a short, escaped excerpt, whatever its length and bytes.
func TestMalformedExcerpt(t *testing.T) {
	dir := t.TempDir()
	cg := filepath.Join(dir, "root", "sys/fs/cgroup/a")
	require.NoError(t, os.MkdirAll(cg, 0o755))
	long := strings.Repeat("\x1b[31mXXXX\u009b", 4000)
	require.NoError(t, os.WriteFile(filepath.Join(cg, "memory.max"), []byte(long), 0o644))
	cf, mf := filepath.Join(dir, "cgroup"), filepath.Join(dir, "mountinfo")
	require.NoError(t, os.WriteFile(cf, []byte("0::/a\n"), 0o644))
	require.NoError(t, os.WriteFile(mf, []byte("1 0 0:1 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"), 0o644))
	_, err := Read(cf, mf, filepath.Join(dir, "root"))
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "\x1b")
	assert.NotContains(t, err.Error(), "\u009b")
	assert.Contains(t, err.Error(), `malformed limit "\x1b[31mXXXX\u009b`)
	assert.Contains(t, err.Error(), "...(44000 bytes)")
	assert.Less(t, len(err.Error()), 600)

	// A line of mountinfo the same way.
	require.NoError(t, os.WriteFile(mf, []byte("garbage "+long+"\n"), 0o644))
	_, err = Read(cf, mf, filepath.Join(dir, "root"))
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "\x1b")
	assert.Less(t, len(err.Error()), 600)
}

// parseMountinfo is parseMountinfoFile on r.
func parseMountinfo(r io.Reader, name string) ([]mount, error) {
	p := newMountinfoParser(name)
	sc := lines(r)
	sc.Buffer(make([]byte, 0, 4096), safefs.MaxLine)
	for sc.Scan() {
		if err := p.line(sc.Text()); err != nil {
			return nil, err
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("cgroupfs: %s: %w", name, err)
	}
	return p.mounts()
}

// lines splits r at '\n' alone: a '\r' may end a cgroup's (unescaped) name.
func lines(r io.Reader) *bufio.Scanner {
	sc := bufio.NewScanner(r)
	sc.Split(func(data []byte, atEOF bool) (int, []byte, error) {
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			return i + 1, data[:i], nil
		}
		if atEOF && len(data) > 0 {
			return len(data), data, nil
		}
		return 0, nil, nil
	})
	return sc
}
