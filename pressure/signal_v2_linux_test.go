package pressure

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgrouptest"
)

// TestV2CgroupPSIArmChecked: the trigger armed on a real cgroup's own
// memory.pressure reads that file's "some" total when it is armed, so its
// events are checked against the stall since arming (issue 32, item 5;
// the host test, TestPSINoEventUnexplained, arms /proc/pressure/memory).
// With no stall in the fresh cgroup an event would be ignored.
func TestV2CgroupPSIArmChecked(t *testing.T) {
	g := cgrouptest.NewV2(t, cgrouptest.LayoutHost, 256<<20)
	path := filepath.Join(g.Dir, "memory.pressure")
	w, err := openSignal(source{kind: srcPSI, path: path, write: psiTrigger(200*time.Millisecond, 2*time.Second)})
	require.NoError(t, err)
	defer w.close()
	require.Empty(t, w.noCheck)
	require.NotNil(t, w.psi)
	assert.False(t, w.psi.full)
	assert.Equal(t, int64(200_000), w.psi.stall)
	assert.GreaterOrEqual(t, w.psi.armed, int64(0))
	since, _, ignore := w.unexplained()
	assert.Zero(t, since, "no task in the cgroup: no stall")
	assert.True(t, ignore, "an event now would be the stall before arming")
}
