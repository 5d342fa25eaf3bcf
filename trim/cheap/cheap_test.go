package cheap

import (
	"errors"
	"github.com/memctl/memctl/internal/arenamax"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSetArenaMaxBadValue(t *testing.T) {
	for _, n := range []int{0, -8} {
		err := SetArenaMax(n)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "cheap:")
		assert.Contains(t, err.Error(), "got "+itoa(n))
		assert.False(t, errors.Is(err, ErrUnavailable))
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func TestSetArenaMaxOperatorWins(t *testing.T) {
	t.Setenv("MALLOC_ARENA_MAX", "4")
	err := SetArenaMax(2)
	require.ErrorIs(t, err, arenamax.ErrOperatorSet)
	assert.Contains(t, err.Error(), "MALLOC_ARENA_MAX=4")
}

func TestZeroStepIsUnavailable(t *testing.T) {
	for _, s := range []*Step{nil, {}} {
		assert.Equal(t, none, s.Allocator())
		assert.Zero(t, s.Retained(), "nothing to release")
		released, err := s.Release()
		assert.Zero(t, released)
		assert.ErrorIs(t, err, ErrUnavailable)
		st, err := s.Stats()
		assert.ErrorIs(t, err, ErrUnavailable)
		assert.Equal(t, int64(-1), st.Retained)
		assert.Equal(t, none, st.Allocator)
	}
}

func TestUnavailableErrors(t *testing.T) {
	s := &Step{library: "/lib/ld-musl-x86_64.so.1", why: "malloc is musl's"}
	err := s.Err()
	require.ErrorIs(t, err, ErrUnavailable)
	assert.False(t, errors.Is(err, errors.ErrUnsupported))
	assert.Equal(t, "cheap: C heap step unavailable: malloc is musl's", err.Error())
	assert.Equal(t, none, s.Allocator())
	assert.Equal(t, "/lib/ld-musl-x86_64.so.1", s.Library())

	off := &Step{why: "Linux-only", unsup: true}
	assert.ErrorIs(t, off.Err(), ErrUnavailable)
	assert.ErrorIs(t, off.Err(), errors.ErrUnsupported)
}

func TestStatsString(t *testing.T) {
	st := unknownStats(jemalloc, "/usr/lib/libjemalloc.so.2")
	assert.Equal(t, "jemalloc", st.String(), "unknown figures are left out")

	st.InUse, st.Active, st.Resident, st.Retained, st.Page = 6<<20+512<<10, 98<<20, 115<<20, 109<<20, 65536
	st.PageWarning = true
	s := st.String()
	assert.Contains(t, s, "jemalloc: in use 6.5 MiB, active 98.0 MiB, resident 115.0 MiB, retained 109.0 MiB, page 65536 B")
	assert.Contains(t, s, "warning: jemalloc page 65536 B > kernel page")

	assert.Equal(t, "none: free 1023 B", Stats{Arena: -1, Mapped: -1, InUse: -1, Free: 1023, Releasable: -1,
		Active: -1, Resident: -1, Retained: -1, Page: -1}.String())
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{
		0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB",
		1 << 20: "1.0 MiB", 3 << 30: "3.0 GiB", 1<<63 - 1: "8589934592.0 GiB",
	} {
		assert.Equal(t, want, formatBytes(n), n)
	}
}
