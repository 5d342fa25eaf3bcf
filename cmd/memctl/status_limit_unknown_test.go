package main

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestStatusLimitUnknown: a cgroup namespace whose visible top sets no limit
// (cgroupfs.Limit.TopNotRoot, tested in internal/cgroupfs TestTopNotRoot)
// shows the limit as unknown with the remedies, in the table and in JSON,
// not as "none".
func TestStatusLimitUnknown(t *testing.T) {
	st := &statusReport{Cgroup: &memCgroup{Version: 2, Path: "/", Dir: "/sys/fs/cgroup", View: "process", LimitUnknown: true}}
	var out bytes.Buffer
	writeTable(&out, st)
	assert.Regexp(t, `(?m)^memory limit +unknown: none up to the top of this cgroup namespace, which is not the root; a limit may be set above it \(give the process MEMCTL_MEMORY_LIMIT from the downward API, or use memctl's SystemFallback\)$`, out.String())
	b, err := json.Marshal(st.Cgroup)
	require.NoError(t, err)
	assert.Contains(t, string(b), `"limit_unknown":true`)
	assert.Contains(t, string(b), `"limit_bytes":null`)

	st.Cgroup.LimitUnknown = false
	out.Reset()
	writeTable(&out, st)
	assert.Regexp(t, `(?m)^memory limit +none$`, out.String())
}
