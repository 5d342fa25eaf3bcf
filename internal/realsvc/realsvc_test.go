package realsvc

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// loadavg returns the first three fields of /proc/loadavg.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "unknown"
}

func TestNearestPatch(t *testing.T) {
	served := []string{"v3.5.9", "v3.6.0", "v3.6.5", "v3.6.12", "v3.6.13", "v3.7.0-rc.0", "v3.7.0"}
	for _, c := range []struct {
		want, got string
		ok        bool
	}{
		{"v3.6.8", "v3.6.5", true},  // 3 below beats 4 above
		{"v3.6.9", "v3.6.12", true}, // 3 above beats 4 below
		{"v3.6.13", "v3.6.13", true},
		{"v3.7.2", "v3.7.0", true}, // pre-releases are not served versions here
		{"v3.8.0", "", false},
		{"3.6.8", "", false},
	} {
		got, ok := NearestPatch(c.want, served)
		assert.Equal(t, c.ok, ok, c.want)
		assert.Equal(t, c.got, got, c.want)
	}
	got, _ := NearestPatch("v1.0.5", []string{"v1.0.4", "v1.0.6"})
	assert.Equal(t, "v1.0.6", got, "a tie goes to the higher patch")
}

func TestParseCPUTime(t *testing.T) {
	// A command name with spaces and a parenthesis, as proc(5) allows.
	stat := "4242 (a b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 8 0 123 456 789"
	d, err := parseCPUTime([]byte(stat))
	require.NoError(t, err)
	assert.Equal(t, 3250*time.Millisecond, d)
	_, err = parseCPUTime([]byte("4242 (x) S 1"))
	assert.Error(t, err)
}

func TestTable(t *testing.T) {
	var tab Table
	tab.Add(Row{Service: "etcd", Check: "GOMEMLIMIT", Plain: "none", Arm: "auto", Value: "179.9 MiB", Bound: "[850, 900] MiB", Issue: "32"})
	tab.Add(Row{Service: "pushgateway", Check: "OOM kill", Plain: "alive", Arm: "budget", Value: "alive", Bound: "none", OK: true})
	lines := strings.Split(strings.TrimSpace(tab.String()), "\n")
	require.Len(t, lines, 3)
	assert.Contains(t, lines[1], "auto: 179.9 MiB")
	assert.True(t, strings.HasSuffix(lines[1], "FAIL (needs issue 32)"), lines[1])
	assert.True(t, strings.HasSuffix(lines[2], "ok"), lines[2])
	assert.Equal(t, "ok (issue 34's case)", Row{OK: true, Issue: "34"}.Result())
	assert.Equal(t, "FAIL", Row{}.Result())
}

// The added files are read back for the builds; each exists and is a
// main package for its build tag.
func TestAddedFiles(t *testing.T) {
	for _, f := range []string{"testdata/pushgateway/realsvc_auto.go", "testdata/pushgateway/realsvc_budget.go", "testdata/etcd/realsvc_auto.go", "testdata/etcdload/main.go"} {
		b, err := added.ReadFile(f)
		require.NoError(t, err, f)
		assert.Contains(t, string(b), "package main", f)
	}
}

// A module the proxy does not serve is an error that names it (the suite
// then skips, saying so); GOPROXY=off stands for an unreachable proxy.
func TestResolveUnserved(t *testing.T) {
	t.Setenv("GOPROXY", "off")
	t.Setenv("GOFLAGS", "-mod=mod")
	_, err := Resolve("github.com/memctl/realsvc-no-such-module", "v1.0.0")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "github.com/memctl/realsvc-no-such-module@v1.0.0")
}

func TestPrune(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	for i, name := range []string{"a", "b", "c", "d"} {
		require.NoError(t, os.MkdirAll(filepath.Join(dir, name), 0o755))
		done := filepath.Join(dir, name, "done")
		require.NoError(t, os.WriteFile(done, nil, 0o644))
		at := now.Add(-time.Duration(i) * time.Minute) // a used last
		require.NoError(t, os.Chtimes(done, at, at))
	}
	old, fresh := filepath.Join(dir, "e.tmp-1"), filepath.Join(dir, "f.tmp-2")
	require.NoError(t, os.Mkdir(old, 0o755))
	require.NoError(t, os.Mkdir(fresh, 0o755))
	require.NoError(t, os.Chtimes(old, now.Add(-2*time.Hour), now.Add(-2*time.Hour)))
	prune(dir, 2)
	var left []string
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		left = append(left, e.Name())
	}
	assert.Equal(t, []string{"a", "b", "f.tmp-2"}, left)
}
