package memctl

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/gcend"
	"github.com/memctl/memctl/internal/relief"
	"github.com/memctl/memctl/thp"
	"github.com/memctl/memctl/trim"
)

func TestStartWiresPressure(t *testing.T) {
	defer goleak.VerifyNone(t)
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	t.Setenv("MEMCTL", "")
	before := gcend.Active()
	var buf bytes.Buffer
	// PolicyKeep: the test process's THP flag is inherited by the other
	// tests' children.
	ctl, err := Start(WithLogger(slog.New(slog.NewJSONHandler(&buf, nil))), WithTHP(thp.PolicyKeep))
	if err != nil {
		t.Logf("start: %v", err)
	}
	r := ctl.Report()
	require.NotEmpty(t, r.Pressure)
	var line map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &rec))
		if rec["msg"] == "memctl started" {
			line = rec
		}
	}
	require.NotNil(t, line, buf.String())
	assert.Equal(t, shortPressure(r.Pressure, r.PressureNote), line["pressure"], "the startup line names the source watched")
	if l, err := cgroupfs.Of(0); err == nil && l.Version == 1 {
		if l.Bytes != cgroupfs.NoLimit {
			assert.Contains(t, r.Pressure, "cgroup v1 "+l.Dir+"/memory.pressure_level")
		} else if _, err := os.Stat("/proc/pressure/memory"); err == nil {
			assert.Contains(t, r.Pressure, "host-wide PSI", "a v1 cgroup without a limit: PSI")
			assert.Contains(t, line["pressure"], "; no memory limit", "the startup line says why")
		}
		assert.Equal(t, int64(-1), ctl.Stats().Pressure.MemoryEvents.OOMKill, "no memory.events in v1")
	}
	assert.Greater(t, gcend.Active(), before, "the death-spiral detector's GC-end hook (and the GOMEMLIMIT refresh's)")
	ch, cancel := ctl.Subscribe(4)
	defer cancel()
	require.NoError(t, ctl.Close())
	_, open := <-ch
	assert.False(t, open, "Close closes the subscription")
	assert.Equal(t, before, gcend.Active())

	var nilCtl *Controller
	ch, _ = nilCtl.Subscribe(1)
	_, open = <-ch
	assert.False(t, open)
}

// Kernel pressure asks the facade's trimmer for a trim through its gate
// (internal/relief); a death spiral's shedding and kernel pressure's cancel
// reach the pools through internal/relief without wiring, and lifts go to
// GOMEMLIMIT's owner, the limiter.
func TestPressureTrimFromFacade(t *testing.T) {
	tr, err := trim.New(trim.Config{})
	require.NoError(t, err)
	defer tr.Close()
	c := &Controller{trimmer: tr}
	defer c.hist.Close()
	remove := relief.SetTrim(pressureTrim(c))
	require.True(t, relief.Trim())
	o := tr.Stats().Pressure
	assert.Equal(t, int64(1), o.Trims+o.Skipped, "one request through the gate")
	var kinds []eventKind
	for _, e := range c.hist.Entries() {
		kinds = append(kinds, e.Kind)
	}
	assert.Contains(t, kinds, kindPressure, "the pressure is marked in the history (Handler's page)")
	remove()
	assert.False(t, relief.Trim(), "removed")
	none := &Controller{}
	pressureTrim(none)() // no trimmer, no limiter: nothing
	assert.Empty(t, none.hist.Entries(), "no trimmer: no mark")
}
