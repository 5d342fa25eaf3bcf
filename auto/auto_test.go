package auto_test

import (
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	_ "github.com/memctl/memctl/auto"
	"github.com/memctl/memctl/internal/thpflag"
	"github.com/memctl/memctl/thp"
)

// The import above ran memctl.Start in this test binary's init, before
// TestMain: the THP flag is visible in this process (PR_GET_THP_DISABLE):
// except-advised where the kernel has it (Linux 6.18), disable elsewhere.
func TestImportDisablesTHP(t *testing.T) {
	st, err := thp.Process()
	if err != nil {
		t.Skipf("needs PR_GET_THP_DISABLE: %v", err)
	}
	if os.Getenv("MEMCTL") == "off" || os.Getenv("MEMCTL_THP") == "keep" {
		assert.Equal(t, thp.StateEnabled, st)
		return
	}
	assert.Contains(t, []thp.State{thp.StateDisabledExceptAdvised, thp.StateDisabled}, st)
	if testing.Verbose() {
		t.Logf("THP flag: %v", st)
	}
}

// With MEMCTL=off in its environment the same import changes nothing.
func TestImportHonoursMEMCTLOff(t *testing.T) {
	if os.Getenv("MEMCTL") == "off" {
		t.Skip("already the child")
	}
	exe, err := os.Executable()
	require.NoError(t, err)
	// The flag is inherited across fork and exec: clear it for the child.
	prev, err := thp.Process()
	require.NoError(t, err)
	require.NoError(t, thpflag.Set(thpflag.Enabled))
	defer func() {
		restore := thp.PolicyKeep // prev was enabled: as it is now
		switch prev {
		case thp.StateDisabled:
			restore = thp.PolicyDisable
		case thp.StateDisabledExceptAdvised:
			restore = thp.PolicyExceptAdvised
		}
		_, err := restore.Apply()
		require.NoError(t, err)
	}()
	cmd := exec.Command(exe, "-test.run=^TestImportDisablesTHP$", "-test.v")
	cmd.Env = append(os.Environ(), "MEMCTL=off")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	assert.Contains(t, string(out), "memctl is off")
	assert.Contains(t, string(out), "--- PASS: TestImportDisablesTHP")
}
