package limits

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgroupfs"
)

func TestNoCgroupIsNormal(t *testing.T) {
	keepMemoryLimit(t)
	debug.SetMemoryLimit(55 << 20)
	for _, perr := range []error{
		fmt.Errorf("%w: v2: hierarchy not mounted", cgroupfs.ErrNoCgroup),
		fmt.Errorf("%w: %w", cgroupfs.ErrNoCgroup, &os.PathError{Op: "open", Path: "testdata/none/cgroup", Err: os.ErrNotExist}),
		fmt.Errorf("cgroupfs: cgroups are Linux only, not plan9: %w", errors.ErrUnsupported),
	} {
		rec := &recorder{}
		none := func() (cgroupfs.Limit, error) { return cgroupfs.Limit{}, perr }
		cfg := cfgFor(none)
		cfg.Logger = slog.New(rec)
		_, d, err := start(t, cfg)
		require.NoError(t, err)
		assert.Equal(t, SourceNone, d.Source)
		assert.Equal(t, int64(55<<20), debug.SetMemoryLimit(-1), "left as it was")
		assert.Contains(t, d.Reason, "no cgroup memory limit: ")
		assert.Contains(t, d.Reason, perr.Error(), "the reason says why")
		assert.Empty(t, rec.levels(), "nothing logged")

		cfg.SystemFallback = true
		_, d, err = start(t, cfg)
		require.NoError(t, err)
		assert.Equal(t, SourceSystem, d.Source)
		assert.Positive(t, d.MemoryLimit)
		assert.Equal(t, int64(float64(d.MemoryLimit)*0.9), debug.SetMemoryLimit(-1))
		debug.SetMemoryLimit(55 << 20)
	}
	// A missing file other than /proc/self/cgroup is an error.
	missing := func() (cgroupfs.Limit, error) {
		return cgroupfs.Limit{}, fmt.Errorf("cgroupfs: %w", &os.PathError{Op: "stat", Path: "/sys/fs/cgroup/x", Err: os.ErrNotExist})
	}
	_, _, err := start(t, cfgFor(missing))
	require.ErrorContains(t, err, "/sys/fs/cgroup/x")
}

// TestLimitUnknownFlag: a cgroup namespace whose visible top sets no limit
// (cgroupfs.Limit.TopNotRoot) is reported as LimitUnknown, with or without
// SystemFallback, so that the state record can say so (issue 22); a real
// root that sets none is not.
func TestLimitUnknownFlag(t *testing.T) {
	keepMemoryLimit(t)
	for _, tc := range []struct {
		top, fallback bool
		source        Source
	}{{true, false, SourceNone}, {true, true, SourceSystem}, {false, false, SourceNone}} {
		cfg := cfgFor(func() (cgroupfs.Limit, error) {
			return cgroupfs.Limit{Version: 2, Cgroup: "/", Bytes: cgroupfs.NoLimit, TopNotRoot: tc.top}, nil
		})
		cfg.SystemFallback = tc.fallback
		_, ml, err := start(t, cfg)
		require.NoError(t, err)
		assert.Equal(t, tc.source, ml.Source, "%+v", tc)
		assert.Equal(t, tc.top, ml.LimitUnknown, "%+v: %s", tc, ml.Reason)
	}
}

// TestUnreadableMountWarns (issue 25 item 5): a second mount of the
// hierarchy whose files cannot be read (cgroupfs.Limit.Unreadable) no
// longer hides the limit a readable mount shows: the limit is followed,
// and the unreadable mount is one WARN naming its file.
func TestUnreadableMountWarns(t *testing.T) {
	keepMemoryLimit(t)
	const denied = "/mnt/other/app/memory.max"
	read := func() (cgroupfs.Limit, error) {
		l, err := fixedLimit(2, 256<<20)()
		l.Unreadable = []error{fmt.Errorf("cgroupfs: open %q: %w", denied, fs.ErrPermission)}
		return l, err
	}
	rec := &recorder{}
	cfg := cfgFor(read)
	cfg.Logger = slog.New(rec)
	_, d, err := start(t, cfg)
	require.NoError(t, err)
	assert.Equal(t, SourceCgroupV2, d.Source)
	assert.Equal(t, ninetyPct(256<<20), d.GoMemLimit)
	w := rec.texts(slog.LevelWarn)
	require.Len(t, w, 1)
	assert.Contains(t, w[0], denied)
	assert.Contains(t, w[0], "permission denied")
}
