package cheap

import (
	"errors"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestOperatorArenaMax(t *testing.T) {
	cases := []struct {
		name      string
		env       map[string]string
		wantName  string
		wantValue string
	}{
		{"nothing set", nil, "", ""},
		{"MALLOC_ARENA_MAX", map[string]string{"MALLOC_ARENA_MAX": "4"}, "MALLOC_ARENA_MAX", "4"},
		{"empty MALLOC_ARENA_MAX is not a setting", map[string]string{"MALLOC_ARENA_MAX": ""}, "", ""},
		{"tunable alone", map[string]string{"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"},
			"GLIBC_TUNABLES", "glibc.malloc.arena_max=2"},
		{"tunable among others", map[string]string{"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0:glibc.malloc.arena_max=3"},
			"GLIBC_TUNABLES", "glibc.malloc.tcache_count=0:glibc.malloc.arena_max=3"},
		{"other tunables only", map[string]string{"GLIBC_TUNABLES": "glibc.malloc.arena_test=2:glibc.malloc.trim_threshold=0"}, "", ""},
		{"empty tunable value", map[string]string{"GLIBC_TUNABLES": "glibc.malloc.arena_max="}, "", ""},
		{"MALLOC_ARENA_MAX wins the report", map[string]string{"MALLOC_ARENA_MAX": "1", "GLIBC_TUNABLES": "glibc.malloc.arena_max=3"},
			"MALLOC_ARENA_MAX", "1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			name, value, ok := OperatorArenaMax(env(c.env))
			assert.Equal(t, c.wantName != "", ok)
			assert.Equal(t, c.wantName, name)
			assert.Equal(t, c.wantValue, value)
		})
	}
}

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
	require.ErrorIs(t, err, ErrOperatorSet)
	assert.Contains(t, err.Error(), "MALLOC_ARENA_MAX=4")
}

func TestZeroStepIsUnavailable(t *testing.T) {
	for _, s := range []*Step{nil, {}} {
		assert.Equal(t, None, s.Allocator())
		assert.Equal(t, int64(-1), s.Retained())
		released, err := s.Release()
		assert.Zero(t, released)
		assert.ErrorIs(t, err, ErrUnavailable)
		st, err := s.Stats()
		assert.ErrorIs(t, err, ErrUnavailable)
		assert.Equal(t, int64(-1), st.Retained)
		assert.Equal(t, None, st.Allocator)
	}
}

func TestUnavailableErrors(t *testing.T) {
	s := &Step{library: "/lib/ld-musl-x86_64.so.1", why: "malloc is musl's"}
	err := s.Err()
	require.ErrorIs(t, err, ErrUnavailable)
	assert.False(t, errors.Is(err, errors.ErrUnsupported))
	assert.Equal(t, "cheap: C heap step unavailable: malloc is musl's", err.Error())
	assert.Equal(t, None, s.Allocator())
	assert.Equal(t, "/lib/ld-musl-x86_64.so.1", s.Library())

	off := &Step{why: "Linux-only", unsup: true}
	assert.ErrorIs(t, off.Err(), ErrUnavailable)
	assert.ErrorIs(t, off.Err(), errors.ErrUnsupported)
}

func TestStatsString(t *testing.T) {
	st := unknownStats(Jemalloc, "/usr/lib/libjemalloc.so.2")
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
