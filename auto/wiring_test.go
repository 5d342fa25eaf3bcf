package auto_test

import (
	"bytes"
	"log/slog"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl"
	"github.com/memctl/memctl/internal/childtest"
)

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
