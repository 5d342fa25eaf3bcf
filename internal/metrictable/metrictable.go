// Package metrictable is the one table of the metrics memctl exports: the
// nested modules metrics (Prometheus) and otelmetrics (OpenTelemetry) both
// walk Metrics, so a new metric is one entry here. It uses only the
// standard library and memctl's packages: the module gains no dependency.
package metrictable

import (
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
	Pool                    // read once per pool, PoolLabel first
	Process                 // read once, from the first pool's Stats (whole process)
)

// PoolLabel is the label of a Pool metric holding limits.Pool.Name.
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
	Labels []Label // the variable labels in Read's order (not PoolLabel)
	// Read emits each series from s, leaving out a figure that does not
	// exist (never a sentinel). Nil for a Histogram.
	Read func(s *Snapshot, emit Emit)
	// Peaks returns a Histogram metric's histogram; nil for the others.
	Peaks func(s *Snapshot) *limits.PeakHistogram
}

// Snapshot is what one collection reads.
type Snapshot struct {
	// Live: a controller was given; without one Report is zero and Stats
	// holds the process's figures.
	Live   bool
	Stats  memctl.Stats
	Report memctl.Report
	// Pool is the pool being read, for Pool and Process metrics.
	Pool limits.PoolStats
}

// Take reads ctl's Stats and Report once (ctl may be nil).
func Take(ctl *memctl.Controller) Snapshot {
	s := Snapshot{Live: ctl != nil, Stats: ctl.Stats()}
	if ctl != nil {
		s.Report = ctl.Report()
	}
	return s
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
