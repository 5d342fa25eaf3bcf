package cgroupfs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReadEventsFixtures(t *testing.T) {
	for _, tc := range []struct {
		file string
		want Events
	}{
		{"v6.18", Events{Low: 0, High: 12, Max: 3456, OOM: 7, OOMKill: 2, OOMGroupKill: 0}},
		// Before Linux 5.17 there is no oom_group_kill: absent, not zero.
		{"v5.4", Events{Low: 0, High: 0, Max: 0, OOM: 0, OOMKill: 0, OOMGroupKill: -1}},
		// A key a newer kernel adds is skipped.
		{"newer-key", Events{Low: 1, High: 2, Max: 3, OOM: 4, OOMKill: 5, OOMGroupKill: 6}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			got, err := ReadEvents(filepath.Join("testdata", "events", tc.file))
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestReadEventsMalformed(t *testing.T) {
	entries, err := os.ReadDir(filepath.Join("testdata", "events"))
	require.NoError(t, err)
	n := 0
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "bad-") {
			continue
		}
		n++
		t.Run(e.Name(), func(t *testing.T) {
			path := filepath.Join("testdata", "events", e.Name())
			got, err := ReadEvents(path)
			require.Error(t, err)
			assert.Contains(t, err.Error(), path, "the error names the file")
			assert.Equal(t, Events{-1, -1, -1, -1, -1, -1}, got, "no counter is guessed")
		})
	}
	assert.GreaterOrEqual(t, n, 10)
}

func TestParseEventsBounds(t *testing.T) {
	// Over 64 KiB of unknown keys: refused without reading on.
	big := strings.Repeat("x 1\n", 20000) + "low 1\n"
	_, err := ParseEvents([]byte(big), "big")
	require.ErrorContains(t, err, "over 65536 bytes")

	// The largest count the kernel can write (u64 in int64 range) is kept.
	got, err := ParseEvents([]byte("max 9223372036854775807\n"), "x")
	require.NoError(t, err)
	assert.Equal(t, int64(9223372036854775807), got.Max)
	assert.Equal(t, int64(-1), got.Low)

	_, err = ReadEvents(filepath.Join("testdata", "events", "no-such-file"))
	require.ErrorContains(t, err, "no-such-file")
}
