package main

import (
	"bytes"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The memory.events counters of a v2 cgroup reach the table and the JSON
// from the kernel's own format; this machine has no v2 memory controller,
// so the files are fixtures (internal/cgroupfs/testdata/events).
func TestStatusMemoryEvents(t *testing.T) {
	b, err := os.ReadFile("../../internal/cgroupfs/testdata/events/v5.4")
	require.NoError(t, err)
	m, err := parseMemoryEvents(b, "/sys/fs/cgroup/app/memory.events")
	require.NoError(t, err)
	assert.Equal(t, map[string]int64{"low": 0, "high": 0, "max": 0, "oom": 0, "oom_kill": 0}, m,
		"a counter the kernel does not write (oom_group_kill before 5.17) is left out, not shown as 0")

	b, err = os.ReadFile("../../internal/cgroupfs/testdata/events/v6.18")
	require.NoError(t, err)
	m, err = parseMemoryEvents(b, "/sys/fs/cgroup/app/memory.events")
	require.NoError(t, err)
	require.Contains(t, m, "oom_group_kill")

	st := &statusReport{MemoryEvents: m}
	var out bytes.Buffer
	writeTable(&out, st)
	assert.Contains(t, out.String(), `"oom_kill"`)

	_, err = parseMemoryEvents([]byte("oom_kill 1\x1b[2J\n"), "/sys/fs/cgroup/evil\x1b]0;x\a/memory.events")
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "\x1b", "the error quotes what the target wrote")
}
