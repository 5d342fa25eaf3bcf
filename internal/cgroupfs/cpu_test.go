package cgroupfs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// cpuFixture writes a /proc/PID/cgroup and mountinfo into a temporary
// directory and returns CPUStatFile's answer, with paths relative to its
// root directory.
func cpuFixture(t *testing.T, cgroup, mountinfo string) (string, error) {
	t.Helper()
	d := t.TempDir()
	cg, mi, root := filepath.Join(d, "cgroup"), filepath.Join(d, "mountinfo"), filepath.Join(d, "root")
	require.NoError(t, os.WriteFile(cg, []byte(cgroup), 0o644))
	require.NoError(t, os.WriteFile(mi, []byte(mountinfo), 0o644))
	p, err := CPUStatFile(cg, mi, root)
	if err != nil {
		return "", err
	}
	rel, ok := strings.CutPrefix(p, root)
	require.True(t, ok, "%s is under the root %s", p, root)
	return rel, nil
}

const (
	miV1CPU = `25 1 0:22 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
31 25 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime shared:12 - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
`
	miV2 = "30 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
)

func TestCPUStatFile(t *testing.T) {
	for _, tc := range []struct {
		name, cgroup, mountinfo, want string
	}{
		{"v1 cpu,cpuacct (Kubernetes on a hybrid host)",
			"12:memory:/kubepods/pod1/ctr\n3:cpu,cpuacct:/kubepods/pod1/ctr\n0::/kubepods/pod1/ctr\n", miV1CPU,
			"/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/ctr/cpu.stat"},
		{"v1 container: the mount root is its cgroup",
			"3:cpu,cpuacct:/docker/abc\n",
			"32 31 0:29 /docker/abc /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu,cpuacct\n",
			"/sys/fs/cgroup/cpu/cpu.stat"},
		{"v1 lists cpuacct only: v2 is read",
			"2:cpuacct:/\n0::/app\n", miV1CPU,
			"/sys/fs/cgroup/unified/app/cpu.stat"},
		{"v2 only", "0::/system.slice/app.service\n", miV2,
			"/sys/fs/cgroup/system.slice/app.service/cpu.stat"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := cpuFixture(t, tc.cgroup, tc.mountinfo)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestCPUStatFileErrors(t *testing.T) {
	for _, tc := range []struct {
		name, cgroup, mountinfo string
		none                    bool // matches ErrNoThrottleCounter
		msg                     string
	}{
		{"no cpu line, no v2", "4:memory:/a\n", miV1CPU, true, "lists neither the cpu controller"},
		{"cpu not mounted", "3:cpu:/a\n", miV2, true, "v1 cpu: hierarchy not mounted"},
		{"outside the namespace", "0::/../../x\n", miV2, true, "outside this cgroup namespace"},
		{"malformed line", "3:cpu\n", miV1CPU, false, "malformed"},
		{"dot-dot after a name", "3:cpu:/a/../../etc\n", miV1CPU, false, "malformed cgroup path"},
		{"empty", "", miV1CPU, false, "empty"},
		{"bad mountinfo", "3:cpu:/a\n", "garbage\n", false, "mountinfo"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := cpuFixture(t, tc.cgroup, tc.mountinfo)
			require.Error(t, err)
			assert.Equal(t, tc.none, errors.Is(err, ErrNoThrottleCounter), "%v", err)
			assert.Contains(t, err.Error(), tc.msg)
		})
	}
}

func TestParseThrottled(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     time.Duration
		err      string
		none     bool
	}{
		{"v1", "nr_periods 120\nnr_throttled 98\nthrottled_time 8700000000\nnr_bursts 0\nburst_time 0\n", 8700 * time.Millisecond, "", false},
		{"v2", "usage_usec 100\nuser_usec 60\nsystem_usec 40\nnr_periods 10\nnr_throttled 4\nthrottled_usec 250000\nnr_bursts 0\nburst_usec 0\n", 250 * time.Millisecond, "", false},
		{"v2 without the cpu controller", "usage_usec 100\nuser_usec 60\nsystem_usec 40\n", 0, "neither throttled_time", true},
		{"empty", "", 0, "neither throttled_time", true},
		{"blank lines", "\nthrottled_usec 1\n\n", time.Microsecond, "", false},
		{"not a number", "throttled_usec x\n", 0, "line 1: throttled_usec is not a count", false},
		{"negative", "throttled_time -1\n", 0, "is not a count", false},
		{"overflows as µs", "throttled_usec 9223372036854776\n", 0, "fits in int64 nanoseconds", false},
		{"largest µs", "throttled_usec 9223372036854775\n", 9223372036854775 * time.Microsecond, "", false},
		{"overflows int64", "throttled_time 9223372036854775808\n", 0, "is not a count", false},
		{"no value", "throttled_time\n", 0, "malformed", false},
		{"escape in a bad line", "\x1b[2Jjunk\n", 0, `\x1b`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseThrottled([]byte(tc.in), "cpu.stat")
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.err)
				assert.Contains(t, err.Error(), "cpu.stat")
				assert.Equal(t, tc.none, errors.Is(err, ErrNoThrottleCounter))
				assert.NotContains(t, err.Error(), "\x1b")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}
