// Package metrictable is the one table of the metrics memctl exports: the
// nested modules metrics (Prometheus) and otelmetrics (OpenTelemetry) each
// walk Metrics, so that both export the same figures under the names of
// their conventions. An entry gives the metric's two names, its unit, help,
// kind, scope and labels, and how to read it from a Snapshot. Adding a
// metric is one entry in this package's table, and both modules export it.
//
// It uses only the standard library and memctl's own packages, so that the
// memctl module gains no dependency.
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
	// Gauge is a value that goes up and down.
	Gauge Kind = iota
	// Counter is a value that only goes up (a cumulative, monotonic sum).
	Counter
	// Histogram is the per-request peaks of a pool (Metric.Peaks): a
	// Prometheus histogram; in OpenTelemetry, whose API has no asynchronous
	// histogram, an Int64 counter of the cumulative counts, one series per
	// upper bound in bytes (attribute le, "+Inf" for the count of all).
	Histogram
)

// Scope is what a metric is read for.
type Scope uint8

const (
	// Controller metrics are read once per collection (Snapshot.Stats and
	// Snapshot.Report), whether a controller was given or not.
	Controller Scope = iota
	// Pool metrics are read once per pool (Snapshot.Pool), with the label
	// PoolLabel before their own; they exist only when a pool is given.
	Pool
	// Process metrics are read once per collection from the first pool's
	// Stats (Snapshot.Pool): they count for the whole process; they exist
	// only when a pool is given.
	Process
)

// PoolLabel is the label that names the pool of a Pool metric: the pool's
// own name (limits.Pool.Name).
const PoolLabel = "pool"

// Label is a variable label of a metric.
type Label struct {
	Name string
	// Bool: the values are "true" and "false"; OpenTelemetry gets them as
	// bool attributes.
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
	// OTel is the OpenTelemetry instrument name: dots, no unit.
	OTel string
	// Unit is the OpenTelemetry (UCUM) unit: By, s, 1, or a {annotation}.
	Unit string
	// Help is the description, the same in both.
	Help string
	Kind Kind
	// Float: the OpenTelemetry instrument is Float64 (the value has a
	// fraction); otherwise Int64, and the value is an integer.
	Float bool
	Scope Scope
	// Labels are the variable labels, in the order Read gives their values
	// (PoolLabel, which the adapters add first for a Pool metric, is not
	// among them).
	Labels []Label
	// Read emits the metric's series from s, once per series; not at all
	// for a figure that does not exist (no GOMEMLIMIT, no trim yet, a C
	// heap figure the allocator does not report), which is left out rather
	// than given a sentinel value. Nil for a Histogram.
	Read func(s *Snapshot, emit Emit)
	// Peaks returns the histogram of a Histogram metric (see Buckets); nil
	// for the other kinds.
	Peaks func(s *Snapshot) *limits.PeakHistogram
}

// Snapshot is what one collection reads.
type Snapshot struct {
	// Live: a controller was given. Without one, Stats holds the figures of
	// the process (GOMEMLIMIT, the C heap, the misuse count) and Report is
	// zero.
	Live   bool
	Stats  memctl.Stats
	Report memctl.Report
	// Pool is the Stats of the pool being read, for the Pool and Process
	// metrics.
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

// ObjectLabel is the object label of h: its path made UTF-8 (a Prometheus
// label value and an OTLP string must be, and a path need not be), with
// " (namespace N)" after it for an object of a dlmopen namespace (the same
// path can be loaded in two, and two series must not have the same
// labels).
func ObjectLabel(h *cheap.Heap) string {
	s := strings.ToValidUTF8(h.Library, "\uFFFD")
	if h.Namespace != 0 {
		s += " (namespace " + strconv.FormatInt(h.Namespace, 10) + ")"
	}
	return s
}
