package auto_test

import (
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	_ "github.com/memctl/memctl/auto"
	"github.com/memctl/memctl/internal/procfs"
	"github.com/memctl/memctl/thp"
)

// The import above ran memctl.Start in this test binary's init, before
// TestMain: the THP flag is visible in this process's /proc/self/status.
func TestImportDisablesTHP(t *testing.T) {
	st, err := procfs.ReadFile("/proc/self/status")
	if err != nil {
		t.Skipf("needs /proc: %v", err)
	}
	want := int64(0)
	if os.Getenv("MEMCTL") == "off" || os.Getenv("MEMCTL_THP") == "keep" {
		want = 1
	}
	v, err := st.Int("THP_enabled")
	require.NoError(t, err)
	assert.Equal(t, want, v)
}

// With MEMCTL=off in its environment the same import changes nothing.
func TestImportHonoursMEMCTLOff(t *testing.T) {
	if os.Getenv("MEMCTL") == "off" {
		t.Skip("already the child")
	}
	exe, err := os.Executable()
	require.NoError(t, err)
	// The flag is inherited across fork and exec: clear it for the child.
	require.NoError(t, thp.Enable())
	defer func() { require.NoError(t, thp.Disable()) }()
	cmd := exec.Command(exe, "-test.run=^TestImportDisablesTHP$", "-test.v")
	cmd.Env = append(os.Environ(), "MEMCTL=off")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	assert.Contains(t, string(out), "memctl is off")
	assert.Contains(t, string(out), "--- PASS: TestImportDisablesTHP")
}
