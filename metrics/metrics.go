package metrics

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memctl/memctl"
	"github.com/memctl/memctl/internal/metrictable"
	"github.com/memctl/memctl/limits"
)

// Pool is a budget pool for the collector.
type Pool struct {
	// Name, the pool label, must be the pool's own name (PoolConfig.Name)
	// and unique among the pools of one collector. Default: ""
	// (Pool.Name()).
	Name string
	Pool *limits.Pool
}

// collector is the prometheus.Collector Register registers.
type collector struct {
	ctl   *memctl.Controller
	pools []metrictable.NamedPool
	// descs are metrictable.Metrics' descriptions; nil for pool and
	// process metrics without a pool.
	descs []*prometheus.Desc
}

// Register registers with reg (prometheus.DefaultRegisterer, or a registry of
// the caller's) a collector for ctl (the controller memctl.Start returned) and
// pools, and returns it (for reg.Unregister). A nil ctl is allowed (the
// auto package started memctl): the scrape then has GOMEMLIMIT, the C heap
// and the misuse count, and memctl_enabled is 0. It returns an error for a
// nil Pool, a Name other than the pool's own, two pools of one name, and
// reg.Register's error.
func Register(reg prometheus.Registerer, ctl *memctl.Controller, pools ...Pool) (prometheus.Collector, error) {
	c, err := newCollector(ctl, pools...)
	if err != nil {
		return nil, err
	}
	if err := reg.Register(c); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return c, nil
}

// newCollector returns the collector of Register, not registered.
func newCollector(ctl *memctl.Controller, pools ...Pool) (*collector, error) {
	named := make([]metrictable.NamedPool, len(pools))
	for i, p := range pools {
		named[i] = metrictable.NamedPool(p)
	}
	if err := metrictable.CheckPools("metrics", named); err != nil {
		return nil, err
	}
	c := &collector{ctl: ctl, pools: named, descs: make([]*prometheus.Desc, len(metrictable.Metrics))}
	for i, m := range metrictable.Metrics {
		if m.Scope != metrictable.Controller && len(pools) == 0 {
			continue
		}
		var labels []string
		for _, l := range m.Labels {
			labels = append(labels, l.Name)
		}
		c.descs[i] = prometheus.NewDesc(m.Prom, m.Help, labels, nil)
	}
	return c, nil
}

// Describe is part of prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		if d != nil {
			ch <- d
		}
	}
}

// Collect reads the statistics once and sends the metrics.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	metrictable.Walk(c.ctl, c.pools, func(i int, s *metrictable.Snapshot) {
		m, desc := &metrictable.Metrics[i], c.descs[i]
		if m.Kind == metrictable.Histogram {
			ch <- histogram(desc, m.Peaks(s), s.PoolName)
			return
		}
		kind := prometheus.GaugeValue
		if m.Kind == metrictable.Counter {
			kind = prometheus.CounterValue
		}
		m.Read(s, func(v float64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(desc, kind, v, labels...)
		})
	})
}

// histogram is h, the pool's peaks, as a Prometheus histogram.
func histogram(desc *prometheus.Desc, h *limits.PeakHistogram, pool string) prometheus.Metric {
	b, count := metrictable.Buckets(h)
	buckets := make(map[float64]uint64, len(b))
	for _, x := range b {
		buckets[float64(x.Bound)] = x.N
	}
	return prometheus.MustNewConstHistogram(desc, count, float64(h.Sum), buckets, pool)
}
