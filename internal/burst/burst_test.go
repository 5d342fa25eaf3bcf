package burst

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/procfs"
)

func TestAllocSizes(t *testing.T) {
	assert.Nil(t, Alloc(-1))
	assert.Nil(t, Alloc(ObjectSize-1))
	objs := Alloc(3*ObjectSize + 5)
	require.Len(t, objs, 3)
	for _, o := range objs {
		assert.Len(t, o, ObjectSize)
		assert.Equal(t, byte(1), o[4096])
	}
}

// The pages are really resident: RSS grows by about the burst.
func TestAllocIsResident(t *testing.T) {
	before, err := procfs.RSS(0)
	if err != nil {
		t.Skipf("needs /proc: %v", err)
	}
	objs := Alloc(64 << 20)
	after, err := procfs.RSS(0)
	require.NoError(t, err)
	assert.Greater(t, after-before, int64(56<<20), "RSS grew by %d bytes", after-before)
	runtime.KeepAlive(objs)
}
