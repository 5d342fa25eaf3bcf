package auto_test

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl"
)

// The auto import plus Start is a second Start: one WARN that names the
// auto package, and after the newer controller's Close the package-level
// functions reach the one auto started again (issue 14: they reached
// neither).
func TestStartBesideAutoWarns(t *testing.T) {
	var buf bytes.Buffer
	ctl, _ := memctl.Start(memctl.WithLogger(slog.New(slog.NewTextHandler(&buf, nil))))
	before := ctl.Stats().Misuse
	require.NoError(t, ctl.Close())
	out := buf.String()
	assert.Contains(t, out, "level=WARN")
	assert.Contains(t, out, "Start called while an earlier controller is live")
	assert.Contains(t, out, "github.com/memctl/memctl/auto.init", "names where the earlier one was started")

	memctl.AfterBurst()
	memctl.Begin()()
	assert.Equal(t, before, ctl.Stats().Misuse, "auto's controller serves again: no call without a controller")
	assert.Equal(t, int64(1), before, "the second Start was counted once")
}
