package trim

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/trim/cheap"
)

func TestDefaultCHeap(t *testing.T) {
	c := realDeps.cheap()
	require.NotNil(t, c)
	assert.Equal(t, cheap.Detect().Allocator(), c.Allocator())
	if err := cheap.Detect().Err(); err != nil {
		// cgo off, not Linux, or no known allocator.
		assert.Equal(t, "none", c.Allocator())
		assert.Zero(t, c.Retained(), "nothing to release")
		_, err := c.ReleaseOver(-1)
		assert.ErrorIs(t, err, cheap.ErrUnavailable)
		return
	}
	assert.Contains(t, []string{"glibc", "jemalloc", "mimalloc", "tcmalloc"}, c.Allocator())
	_, err := c.ReleaseOver(-1)
	require.NoError(t, err)
}

type fakeCHeap struct {
	released int64
	err      error
}

func (fakeCHeap) Allocator() string                  { return "fake" }
func (fakeCHeap) Retained() int64                    { return 3 << 20 }
func (h fakeCHeap) ReleaseOver(int64) (int64, error) { return h.released, h.err }

func TestCHeapStep(t *testing.T) {
	f := &fakeStep{}
	tr, err := newT(testConfig{Config: Config{}, hooks: hooks{goStep: f.run, cheap: fakeCHeap{released: 5 << 20}}})
	require.NoError(t, err)
	defer tr.Close()
	r, err := tr.TrimNow()
	require.NoError(t, err)
	assert.Equal(t, int64(6<<20), r, "Go step 1 MiB + C step 5 MiB")
	s := tr.Stats()
	assert.Equal(t, "fake", s.CHeapAllocator)
	assert.Equal(t, int64(6<<20), s.TotalReleased)
	assert.NoError(t, s.CHeapErr)

	boom := errors.New("boom")
	tr2, err := newT(testConfig{Config: Config{}, hooks: hooks{goStep: f.run, cheap: fakeCHeap{released: -1, err: boom}}})
	require.NoError(t, err)
	defer tr2.Close()
	r, err = tr2.TrimNow()
	assert.ErrorIs(t, err, boom)
	assert.Equal(t, int64(1<<20), r, "-1 from the C step adds nothing")
	assert.ErrorIs(t, tr2.Stats().CHeapErr, boom)

	// The default step in this build: unavailable, recorded, not returned.
	tr3, err := newT(testConfig{Config: Config{}, hooks: hooks{goStep: f.run}})
	require.NoError(t, err)
	defer tr3.Close()
	_, err = tr3.TrimNow()
	assert.NoError(t, err)
	s = tr3.Stats()
	assert.Equal(t, realDeps.cheap().Allocator(), s.CHeapAllocator)
	if s.CHeapAllocator == "none" {
		assert.ErrorIs(t, s.CHeapErr, cheap.ErrUnavailable)
	}

	tr4, err := newT(testConfig{Config: Config{NoCHeap: true}, hooks: hooks{goStep: f.run}})
	require.NoError(t, err)
	defer tr4.Close()
	_, err = tr4.TrimNow()
	assert.NoError(t, err)
	assert.Empty(t, tr4.Stats().CHeapAllocator)
	assert.NoError(t, tr4.Stats().CHeapErr)
}
