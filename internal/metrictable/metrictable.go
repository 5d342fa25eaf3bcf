// Package metrictable is the one table of the metrics memctl exports: the
// nested modules metrics (Prometheus) and otelmetrics (OpenTelemetry) both
// walk Metrics, so a new metric is one entry here. It uses only the
// standard library and memctl's packages: the module gains no dependency.
package metrictable

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/memctl/memctl"
	"github.com/memctl/memctl/limits"
	"github.com/memctl/memctl/trim/cheap"
)

// Kind is what a metric is.
type Kind uint8

const (
	Gauge   Kind = iota // a value that goes up and down
	Counter             // a cumulative, monotonic sum
	// Histogram is a pool's request peaks (Metric.Peaks); in OpenTelemetry
	// (no asynchronous histogram) an Int64 counter of cumulative counts,
	// one series per bound (attribute le, "+Inf" for all).
	Histogram
)

// Scope is what a metric is read for. Pool and Process metrics exist only
// when a pool is given.
type Scope uint8

const (
	Controller Scope = iota // read once per collection, controller or not
	Pool                    // read once per pool; its first label is PoolLabel
	Process                 // read once, from the first pool's Stats (whole process)
)

// PoolLabel is the first label of a Pool metric: limits.Pool.Name.
const PoolLabel = "pool"

// Label is a variable label of a metric.
type Label struct {
	Name string
	// Bool: the values are "true" and "false" (OpenTelemetry bool attributes).
	Bool bool
}

// Emit records one series of a metric: its value and the values of its
// labels, in the order of Metric.Labels.
type Emit func(v float64, labels ...string)

// Metric is one entry of the table.
type Metric struct {
	// Prom is the Prometheus name: memctl_ prefix, base unit suffix
	// (_bytes, _seconds), _total for a counter, _info for a gauge of 1
	// whose labels carry a state.
	Prom string
	OTel string // the OpenTelemetry instrument name: dots, no unit
	Unit string // the OpenTelemetry (UCUM) unit: By, s, 1, or a {annotation}
	Help string // the description, the same in both
	Kind Kind
	// Float: the OpenTelemetry instrument is Float64; otherwise Int64.
	Float  bool
	Scope  Scope
	Labels []Label // the labels in Read's order
	// Read emits each series from s, leaving out a figure that does not
	// exist (never a sentinel). Nil for a Histogram.
	Read func(s *Snapshot, emit Emit)
	// Peaks returns a Histogram's histogram (a Pool metric whose only
	// label is PoolLabel); nil for the others.
	Peaks func(s *Snapshot) *limits.PeakHistogram
}

// Snapshot is what one collection reads.
type Snapshot struct {
	// Live: a controller was given; without one Report is zero and Stats
	// holds the process's figures.
	Live   bool
	Stats  memctl.Stats
	Report memctl.Report
	// Pool and PoolName are the pool being read, for Pool and Process
	// metrics.
	Pool     limits.PoolStats
	PoolName string
}

// NamedPool is a pool to collect and the name its metrics carry.
type NamedPool struct {
	Name string
	Pool *limits.Pool
}

// CheckPools gives each pool of pools with no Name its own (Pool.Name). It
// returns an error, begun with pkg, for a nil Pool, a Name other than the
// pool's own, and two pools of one name.
func CheckPools(pkg string, pools []NamedPool) error {
	seen := map[string]bool{}
	for i, p := range pools {
		switch {
		case p.Pool == nil:
			return fmt.Errorf("%s: pool %q is nil", pkg, p.Name)
		case p.Name == "":
			pools[i].Name = p.Pool.Name()
		case p.Name != p.Pool.Name():
			return fmt.Errorf("%s: pool %q is named %q in its errors and Stats: one name per pool (set PoolConfig.Name to %q, or leave Pool.Name empty)", pkg, p.Name, p.Pool.Name(), p.Name)
		}
		if seen[pools[i].Name] {
			return fmt.Errorf("%s: two pools named %q: name each with PoolConfig.Name", pkg, pools[i].Name)
		}
		seen[pools[i].Name] = true
	}
	return nil
}

// Walk reads ctl's Stats and Report once (ctl may be nil), and each pool's
// Stats, and calls visit for each metric to collect, by its index in
// Metrics, with the snapshot to read it from: the Controller metrics, each
// pool's Pool metrics, and the Process metrics from the first pool.
func Walk(ctl *memctl.Controller, pools []NamedPool, visit func(i int, s *Snapshot)) {
	s := Snapshot{Live: ctl != nil, Stats: ctl.Stats()}
	if ctl != nil {
		s.Report = ctl.Report()
	}
	scope := func(scope Scope) {
		for i, m := range Metrics {
			if m.Scope == scope {
				visit(i, &s)
			}
		}
	}
	scope(Controller)
	for i, p := range pools {
		s.Pool, s.PoolName = p.Pool.Stats(), p.Name
		scope(Pool)
		if i == 0 {
			scope(Process)
		}
	}
}

// Bucket is one bucket of a peak histogram: its upper bound in bytes and
// the number of peaks at or under it (cumulative).
type Bucket struct {
	Bound int64
	N     uint64
}

// PeakBuckets is the number of bounded buckets of a limits.PeakHistogram.
const PeakBuckets = len(limits.PeakHistogram{}.Counts) - 1

// Buckets returns h's buckets, cumulative, bounds limits.PeakBucketBound(0)
// to (PeakBuckets-1), and the count of all peaks (those above the last bound
// included); a negative count reads as 0.
func Buckets(h *limits.PeakHistogram) (b [PeakBuckets]Bucket, count uint64) {
	var n uint64
	for i := range b {
		n += uint64(max(h.Counts[i], 0))
		b[i] = Bucket{Bound: limits.PeakBucketBound(i), N: n}
	}
	return b, uint64(max(h.Count, 0))
}

// ObjectLabel is the object label of h: its path made valid UTF-8, with
// " (namespace N)" for a dlmopen namespace (one path may load in two).
func ObjectLabel(h *cheap.Heap) string {
	s := strings.ToValidUTF8(h.Library, "\uFFFD")
	if h.Namespace != 0 {
		s += " (namespace " + strconv.FormatInt(h.Namespace, 10) + ")"
	}
	return s
}
