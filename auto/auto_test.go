package auto_test

import (
	"bytes"
	"log/slog"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl"
	_ "github.com/memctl/memctl/auto"
	"github.com/memctl/memctl/internal/childtest"
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

// startBesideChild calls Start in a process whose auto import already
// started a controller, with a text logger on standard error, closes it,
// and reports the misuse counted before and after the package-level calls.
func startBesideChild() {
	ctl, _ := memctl.Start(memctl.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, nil))))
	before := ctl.Stats().Misuse
	if err := ctl.Close(); err != nil {
		childtest.Fail("close: %v", err)
	}
	memctl.AfterBurst()
	memctl.Begin()()
	childtest.Say("MISUSE_BEFORE", before)
	childtest.Say("MISUSE_AFTER", ctl.Stats().Misuse)
}

// The auto import plus Start is a second Start: one WARN that names the
// auto package, and after the newer controller's Close the package-level
// functions reach the one auto started again (issue 14: they reached
// neither). In a child process of its own: the WARN is logged once per
// process, so a second run in this one (-count) would not see it.
func TestStartBesideAutoWarns(t *testing.T) {
	cmd := childtest.Command(t, "startbeside", childEnv)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, stderr.String())
	r := childtest.ParseReport(out)
	log := stderr.String()
	assert.Contains(t, log, "level=WARN")
	assert.Contains(t, log, "Start called while an earlier controller is live")
	assert.Contains(t, log, "github.com/memctl/memctl/auto.init", "names where the earlier one was started")
	assert.Equal(t, r["MISUSE_BEFORE"], r["MISUSE_AFTER"], "auto's controller serves again: no call without a controller")
	assert.Equal(t, "1", r["MISUSE_BEFORE"], "the second Start was counted once")
}
