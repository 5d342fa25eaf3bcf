package metrictable

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/memctl/memctl/limits"
	"github.com/memctl/memctl/trim/cheap"
)

// Every entry is complete, and its two names are its own.
func TestTable(t *testing.T) {
	prom, otel := map[string]bool{}, map[string]bool{}
	for _, m := range Metrics {
		assert.False(t, prom[m.Prom], "Prometheus name %s twice", m.Prom)
		assert.False(t, otel[m.OTel], "OTel name %s twice", m.OTel)
		prom[m.Prom], otel[m.OTel] = true, true
		assert.True(t, strings.HasPrefix(m.Prom, "memctl_"), m.Prom)
		assert.True(t, strings.HasPrefix(m.OTel, "memctl."), m.OTel)
		assert.NotEmpty(t, m.Help, m.Prom)
		assert.NotEmpty(t, m.Unit, m.Prom)
		assert.Equal(t, m.Kind == Counter, strings.HasSuffix(m.Prom, "_total"), "%s: _total for a counter only", m.Prom)
		assert.Equal(t, m.Kind == Histogram, m.Read == nil, m.Prom)
		assert.Equal(t, m.Kind == Histogram, m.Peaks != nil, m.Prom)
		assert.Equal(t, m.Scope == Pool, len(m.Labels) > 0 && m.Labels[0].Name == PoolLabel, "%s: label pool first in a Pool metric only", m.Prom)
		names := map[string]bool{}
		for _, l := range m.Labels {
			assert.False(t, names[l.Name], "%s: label %s twice", m.Prom, l.Name)
			names[l.Name] = true
		}
	}
	assert.Len(t, Metrics, len(controllerMetrics)+len(heapMetrics)+len(poolMetrics)+len(processMetrics))
}

// Each Read gives one value per label, and "true" or "false" for a bool
// label.
func TestReadLabels(t *testing.T) {
	s := Snapshot{Live: true}
	s.Stats.CHeaps = []cheap.Heap{{Prefix: "je_", Namespace: 2, Trimmed: true, Stats: cheap.Stats{Allocator: "jemalloc", Library: "/lib/x.so"}, Releases: 1}}
	s.Stats.Trim.LastDuration, s.Stats.Trim.Trims = time.Millisecond, 1
	s.Pool.Limit, s.Pool.HeapBaseline = 1<<20, 0
	s.Report.MemLimit.MemoryLimit = 1 << 30
	s.PoolName = "http"
	for _, m := range Metrics {
		if m.Kind == Histogram {
			continue
		}
		n := 0
		m.Read(&s, func(_ float64, vs ...string) {
			n++
			if assert.Len(t, vs, len(m.Labels), m.Prom) && m.Scope == Pool {
				assert.Equal(t, "http", vs[0], "%s: the pool's name", m.Prom)
			}
			if len(vs) == len(m.Labels) {
				for i, l := range m.Labels {
					if l.Bool {
						assert.Contains(t, []string{"true", "false"}, vs[i], "%s: %s", m.Prom, l.Name)
					}
				}
			}
		})
		assert.Positive(t, n, "%s: no series", m.Prom)
	}
}

func TestBuckets(t *testing.T) {
	var h limits.PeakHistogram
	h.Counts[0], h.Counts[2], h.Counts[PeakBuckets], h.Count = 1, 2, 1, 4
	h.Counts[3] = -1 // read as 0
	b, count := Buckets(&h)
	assert.Equal(t, uint64(4), count)
	assert.Equal(t, Bucket{Bound: 64 << 10, N: 1}, b[0])
	assert.Equal(t, Bucket{Bound: 256 << 10, N: 3}, b[2])
	assert.Equal(t, Bucket{Bound: 512 << 10, N: 3}, b[3])
	assert.Equal(t, Bucket{Bound: 64 << 30, N: 3}, b[PeakBuckets-1])
}

func TestObjectLabel(t *testing.T) {
	h := cheap.Heap{Namespace: 3, Stats: cheap.Stats{Library: "/tmp/caf\xe9/x.so"}}
	assert.Equal(t, "/tmp/caf\uFFFD/x.so (namespace 3)", ObjectLabel(&h))
	h.Namespace = 0
	assert.Equal(t, "/tmp/caf\uFFFD/x.so", ObjectLabel(&h))
}
