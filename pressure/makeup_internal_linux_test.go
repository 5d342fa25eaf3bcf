//go:build linux

package pressure

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
)

// Attack input (issue 17): host-wide PSI while the host is short of a
// neighbour's anonymous memory (AnonPages far above the page cache, this
// process holding little of it). Before, every such signal also cancelled
// this service's largest request, which gives the neighbour nothing back.
// Now the cancel needs this process to hold at least half of the host's
// anonymous memory; the trim is asked for either way (its gate decides).
func TestHostWideCancelNeedsOwnAnon(t *testing.T) {
	var trims, cancels int
	m := &Monitor{deps: testDeps(nil)}
	m.deps.trim = func() bool { trims++; return true }
	m.deps.cancel = func() int { cancels++; return 1 }
	host := &watcher{name: "host-wide PSI test", hostWide: true}
	const gib = 1 << 30
	for _, tc := range []struct {
		name   string
		mk     makeup
		cancel bool
	}{
		{"a neighbour's anonymous memory", makeup{Anon: 20 * gib, Cache: 2 * gib, Own: 1 * gib}, false},
		{"this process's anonymous memory", makeup{Anon: 20 * gib, Cache: 2 * gib, Own: 12 * gib}, true},
		{"half of it", makeup{Anon: 20 * gib, Cache: 2 * gib, Own: 10 * gib}, true},
		{"own unknown", makeup{Anon: 20 * gib, Cache: 2 * gib, Own: -1}, false},
		{"mostly page cache", makeup{Anon: 2 * gib, Cache: 20 * gib, Own: 2 * gib}, false},
		{"unknown", makeup{Anon: -1, Cache: -1, Own: -1}, false},
	} {
		trims, cancels = 0, 0
		held := m.held.Load()
		assert.True(t, m.act(host, 1, tc.mk), tc.name)
		assert.Equal(t, 1, trims, "%s: the trim is asked for", tc.name)
		want := 0
		if tc.cancel {
			want = 1
		}
		assert.Equal(t, want, cancels, tc.name)
		assert.Equal(t, int64(1-want), m.held.Load()-held, "%s: counted as held", tc.name)
	}
	// A cgroup's own signal: its memory is the cgroup's, Own is not needed.
	trims, cancels = 0, 0
	assert.True(t, m.act(&watcher{name: "cgroup"}, 1, makeup{Anon: 200 << 20, Cache: 10 << 20, Own: -1}))
	assert.Equal(t, 1, cancels)
}

// Issue 32: the WARN that opens a stretch of pressure printed
// own_anon_bytes=-1 for a cgroup's source (Own is read for host-wide PSI
// only) and -1 for a makeup that could not be read. No figure is -1 now:
// an unknown one is "unknown", Own is left out where it is not read.
func TestPressureWarnHasNoSentinel(t *testing.T) {
	for _, tc := range []struct {
		name     string
		hostWide bool
		mk       makeup
		want     string
		absent   string
	}{
		{"a cgroup's source (the issue's line)", false, makeup{Anon: 200 << 20, Cache: 10 << 20, Own: -1, From: "memory.stat"},
			"anon_bytes=209715200 page_cache_bytes=10485760 makeup_from=memory.stat", "own_anon_bytes"},
		{"a cgroup's makeup unknown", false, unknownMakeup("memory.stat"),
			"anon_bytes=unknown page_cache_bytes=unknown makeup_from=memory.stat", "own_anon_bytes"},
		{"host-wide, own RssAnon unreadable", true, makeup{Anon: 20 << 30, Cache: 2 << 30, Own: -1, From: "/proc/meminfo"},
			"anon_bytes=21474836480 page_cache_bytes=2147483648 own_anon_bytes=unknown makeup_from=/proc/meminfo", ""},
		{"host-wide, known", true, makeup{Anon: 20 << 30, Cache: 2 << 30, Own: 1 << 30, From: "/proc/meminfo"},
			"own_anon_bytes=1073741824", ""},
	} {
		var b bytes.Buffer
		m := &Monitor{log: slog.New(slog.NewTextHandler(&b, nil))}
		w := &watcher{m: m, name: "test", hostWide: tc.hostWide}
		w.logPressure(tc.mk)
		assert.Contains(t, b.String(), "level=WARN msg=\"memctl: kernel memory pressure\"", tc.name)
		assert.Contains(t, b.String(), tc.want, tc.name)
		assert.NotContains(t, b.String(), "=-", tc.name)
		if tc.absent != "" {
			assert.NotContains(t, b.String(), tc.absent, tc.name)
		}
	}
}
