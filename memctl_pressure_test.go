package memctl

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/gcend"
	"github.com/memctl/memctl/limits"
	"github.com/memctl/memctl/pressure"
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

func TestPressureConfigFromFacade(t *testing.T) {
	tr, err := trim.New(trim.Config{})
	require.NoError(t, err)
	defer tr.Close()
	c := &Controller{trimmer: tr}
	c.report.MemLimit = limits.MemLimit{GoMemLimit: 230 << 20, MemoryLimit: 256 << 20, Source: limits.SourceCgroupV1}
	pc := pressureConfig(config{logger: slog.Default()}, c)
	assert.Equal(t, int64(256<<20), pc.LiftCeiling, "a lift stops at the cgroup limit")
	assert.NotNil(t, pc.Trim)
	assert.NotNil(t, pc.Logger)

	assert.NotNil(t, pc.Shed, "a death spiral sheds large work in the pools")
	assert.NotNil(t, pc.CancelLargest, "kernel pressure cancels the largest request")
	assert.Nil(t, pc.Lift, "no limiter: the lift sets GOMEMLIMIT itself")

	// A refreshed GOMEMLIMIT: the lift goes through the limiter, which
	// keeps it across refreshes.
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	c.limiter, _, _ = limits.NewMemLimiter(limits.MemLimitConfig{Refresh: -1})
	defer c.limiter.Close()
	c.report.MemLimitRefresh = 10 * time.Second
	assert.NotNil(t, pressureConfig(config{}, c).Lift)
	assert.Equal(t, int64(256<<20), pressureConfig(config{}, c).LiftCeiling)
	c.report.MemLimitRefresh = 0
	c.limiter = nil

	// The operator's GOMEMLIMIT: no ceiling, so no lift.
	c.report.MemLimit = limits.MemLimit{GoMemLimit: 200 << 20, Source: limits.SourceEnv}
	assert.Zero(t, pressureConfig(config{}, c).LiftCeiling)
	// The caller's own settings are kept.
	own := pressure.Config{LiftCeiling: 1 << 30, LiftOff: true}
	c.report.MemLimit = limits.MemLimit{GoMemLimit: 230 << 20, MemoryLimit: 256 << 20, Source: limits.SourceCgroupV2}
	pc = pressureConfig(config{pressure: own}, c)
	assert.Equal(t, int64(1<<30), pc.LiftCeiling)
	assert.True(t, pc.LiftOff)
	assert.Nil(t, pressureConfig(config{}, &Controller{}).Trim, "no trimmer: no trim")
}
