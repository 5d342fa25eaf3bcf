package otelmetrics

import (
	"context"
	"fmt"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/memctl/memctl"
	"github.com/memctl/memctl/internal/metrictable"
	"github.com/memctl/memctl/limits"
)

// ScopeName is the instrumentation scope (the meter's name).
const ScopeName = "github.com/memctl/memctl/otelmetrics"

// Pool is a budget pool for Register. Name, the pool attribute, must be the
// pool's own name (PoolConfig.Name) and unique among the pools of one
// Register. Default: "" (Pool.Name()).
type Pool struct {
	Name string
	Pool *limits.Pool
}

// Register creates memctl's instruments on a meter of mp (ScopeName) and
// registers the one callback that observes them for ctl (the controller
// memctl.Start returned) and pools. A nil ctl is allowed (the auto
// package started memctl): then GOMEMLIMIT, the C heap and the misuse
// count are observed and memctl.enabled is 0. Call Unregister on the
// result to stop. It returns an error for a nil Pool, a Name other than
// the pool's own, two pools of one name, and the meter's errors. Safe for
// concurrent use, as is the callback.
func Register(mp metric.MeterProvider, ctl *memctl.Controller, pools ...Pool) (metric.Registration, error) {
	named := make([]metrictable.NamedPool, len(pools))
	for i, p := range pools {
		named[i] = metrictable.NamedPool(p)
	}
	if err := metrictable.CheckPools("otelmetrics", named); err != nil {
		return nil, err
	}
	m := mp.Meter(ScopeName)
	// obs are metrictable.Metrics' instruments; nil for pool and process
	// metrics without a pool.
	obs := make([]metric.Observable, len(metrictable.Metrics))
	var all []metric.Observable
	for i, in := range metrictable.Metrics {
		if in.Scope != metrictable.Controller && len(pools) == 0 {
			continue
		}
		var err error
		if obs[i], err = create(m, &in); err != nil {
			return nil, fmt.Errorf("otelmetrics: %s: %w", in.OTel, err)
		}
		all = append(all, obs[i])
	}
	return m.RegisterCallback(func(_ context.Context, ob metric.Observer) error {
		metrictable.Walk(ctl, named, func(i int, s *metrictable.Snapshot) {
			observe(ob, obs[i], &metrictable.Metrics[i], s)
		})
		return nil
	}, all...)
}

// create makes the observable instrument of in on m: a Histogram is an
// Int64 counter of its cumulative counts.
func create(m metric.Meter, in *metrictable.Metric) (metric.Observable, error) {
	unit, desc := metric.WithUnit(in.Unit), metric.WithDescription(in.Help)
	switch {
	case in.Kind == metrictable.Gauge && in.Float:
		return m.Float64ObservableGauge(in.OTel, unit, desc)
	case in.Kind == metrictable.Gauge:
		return m.Int64ObservableGauge(in.OTel, unit, desc)
	case in.Float:
		return m.Float64ObservableCounter(in.OTel, unit, desc)
	default:
		return m.Int64ObservableCounter(in.OTel, unit, desc)
	}
}

// observe observes on o the series of in read from s.
func observe(ob metric.Observer, o metric.Observable, in *metrictable.Metric, s *metrictable.Snapshot) {
	record := func(v float64, attrs ...attribute.KeyValue) {
		switch x := o.(type) {
		case metric.Float64Observable:
			ob.ObserveFloat64(x, v, metric.WithAttributes(attrs...))
		case metric.Int64Observable:
			ob.ObserveInt64(x, int64(v), metric.WithAttributes(attrs...))
		}
	}
	if in.Kind == metrictable.Histogram {
		pool := attribute.String(metrictable.PoolLabel, s.PoolName)
		b, count := metrictable.Buckets(in.Peaks(s))
		for _, x := range b {
			record(float64(x.N), pool, attribute.String("le", strconv.FormatInt(x.Bound, 10)))
		}
		record(float64(count), pool, attribute.String("le", "+Inf"))
		return
	}
	in.Read(s, func(v float64, labels ...string) {
		attrs := make([]attribute.KeyValue, len(labels))
		for j, l := range in.Labels {
			if l.Bool {
				attrs[j] = attribute.Bool(l.Name, labels[j] == "true")
			} else {
				attrs[j] = attribute.String(l.Name, labels[j])
			}
		}
		record(v, attrs...)
	})
}
