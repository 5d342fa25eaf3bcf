package cgroupfs

import (
	"io/fs"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestHighEACCES (attack on issue 18): a memory.high the reader may not
// read (EACCES, read as nobody over a fixture whose memory.high has mode
// 0000) failed the whole read, so memory.max was not honoured either. It
// is kept aside in HighErr, naming the file, as a malformed memory.high
// is, and memory.max is read.
func TestHighEACCES(t *testing.T) {
	dir, high := unreadableTree(t, map[string]string{"cg/cgroup.controllers": "memory\n",
		"cg/app/memory.max": "268435456\n", "cg/app/memory.high": "134217728\n"}, "cg/app/memory.high")
	l, err := readTreeAsNobody(t, dir)
	require.NoError(t, err)
	assert.Equal(t, int64(256<<20), l.Bytes, "memory.max is honoured")
	assert.Equal(t, int64(256<<20), l.Max)
	assert.Equal(t, int64(NoLimit), l.High)
	require.Error(t, l.HighErr)
	assert.ErrorIs(t, l.HighErr, fs.ErrPermission)
	assert.ErrorContains(t, l.HighErr, high)
}
