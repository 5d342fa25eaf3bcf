package cgrouptest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestV2Layouts checks each layout from inside: the cgroup the child sees
// (/proc/self/cgroup), what its /sys/fs/cgroup shows and how it is mounted.
func TestV2Layouts(t *testing.T) {
	RequireV2(t)
	const limit = 64 << 20
	for _, l := range Layouts() {
		t.Run(l.Name, func(t *testing.T) {
			g := NewV2(t, l, limit)
			rel, err := filepath.Rel(g.Mount, g.Dir)
			require.NoError(t, err)
			relTop := filepath.Dir(rel)
			script := `echo "CG=$(cat /proc/self/cgroup)"
echo "MAX=$(cat "$0/memory.max")"
echo "TOPMAX=$(cat "$0/` + relTop + `/memory.max" 2>/dev/null)"
echo "DIRMAX=$(cat "$0/` + rel + `/memory.max" 2>/dev/null)"
echo "OPTS=$(awk -v m="$0" '$5 == m && / - cgroup2 / {print $6}' /proc/self/mountinfo)"
echo "SELF=$(cat /proc/self/cgroup | cut -d: -f3)"
`
			cmd := exec.Command("sh", "-c", script, g.Mount)
			g.Wrap(t, cmd)
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s", out)
			kv := map[string]string{}
			for _, line := range strings.Split(string(out), "\n") {
				if k, v, ok := strings.Cut(line, "="); ok {
					kv[k] = v
				}
			}
			want := strconv.Itoa(limit)
			switch l {
			case LayoutHost:
				assert.Equal(t, "0::/"+rel, kv["CG"])
				assert.Empty(t, kv["MAX"], "the mount's top is the host's root, which has no memory.max")
				assert.Equal(t, want, kv["DIRMAX"])
			case LayoutContainer:
				assert.Equal(t, "0::/", kv["CG"])
				assert.Equal(t, want, kv["MAX"], "the mount's top is the namespace root, which holds the limit")
				assert.True(t, strings.HasPrefix(kv["OPTS"], "rw"), kv["OPTS"])
			case LayoutReadOnly:
				assert.Equal(t, "0::/", kv["CG"])
				assert.Equal(t, want, kv["MAX"])
				assert.True(t, strings.HasPrefix(kv["OPTS"], "ro"), kv["OPTS"])
			case LayoutPod:
				assert.Equal(t, "0::/", kv["CG"])
				assert.Equal(t, "max", kv["MAX"], "the namespace root has no limit; its parent has")
				assert.Equal(t, want, readTrim(t, filepath.Join(g.Top, "memory.max")))
			case LayoutWholeTree:
				assert.Equal(t, "0::/", kv["CG"])
				assert.Empty(t, kv["MAX"], "the host's mount shows the host's root, which has no memory.max")
				assert.Equal(t, "max", kv["DIRMAX"])
				assert.Equal(t, want, kv["TOPMAX"], "the whole tree is visible, with the limit on the parent")
			}
		})
	}
}

func readTrim(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return strings.TrimSpace(string(b))
}
