package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memctl/memctl/internal/burst"
	"github.com/memctl/memctl/internal/cpuquota"
	"github.com/memctl/memctl/internal/procfs"
)

// The load scenarios: a server in the child, an open-loop load generator in
// the parent (outside the server's cgroups).

// loadParams are the load scenarios' sizes (bytes), rates and times.
type loadParams struct {
	// Live is the server's live heap: 15/16 of it 64 KiB buffers, 1/16
	// 64-byte pointer-linked nodes that the GC must trace.
	Live int64 `json:"live_bytes"`
	// Burst is allocated and dropped every Period, the first FirstBurst
	// after the start; Check after each, the server compares its VmRSS
	// with that before the burst.
	Burst int64 `json:"burst_bytes"`
	// ContendedBurst is smaller: at half of a 10% quota, touching Burst's
	// pages would outlast the period many times over.
	ContendedBurst int64         `json:"contended_burst_bytes"`
	Period         time.Duration `json:"period"`
	FirstBurst     time.Duration `json:"first_burst"`
	Check          time.Duration `json:"check"`
	For            time.Duration `json:"for"` // the measured window
	// Rate is the load generator's requests per second (ContendedRate the
	// contended variant's), each allocating Alloc in the server; see
	// openLoop for Timeout and MaxInFlight.
	Rate          float64       `json:"rate"`
	ContendedRate float64       `json:"contended_rate"`
	Alloc         int64         `json:"request_alloc_bytes"`
	Timeout       time.Duration `json:"timeout"`
	MaxInFlight   int           `json:"max_in_flight"`
	// CgroupLimit is the arms' cgroup limit: 1 GiB live plus a 512 MiB
	// burst under GOGC=100 needs more than the default 2 GiB.
	CgroupLimit int64 `json:"cgroup_limit_bytes"`
	// The contended variant's CFS quota and period, in microseconds.
	Quota       int `json:"cfs_quota_us"`
	QuotaPeriod int `json:"cfs_period_us"`
	// The load-gc variant's GOGC (set in every arm before memctl starts),
	// live heap and per-request garbage.
	GCPercent int   `json:"gc_gogc"`
	GCLive    int64 `json:"gc_live_bytes"`
	GCAlloc   int64 `json:"gc_request_alloc_bytes"`
}

// variantParams returns the parameters load scenario name runs with.
func variantParams(name string, lp loadParams) loadParams {
	switch name {
	case "load-gc":
		lp.Live, lp.Alloc = lp.GCLive, lp.GCAlloc
	case "load-contended":
		lp.Rate = lp.ContendedRate
		if lp.ContendedBurst > 0 { // 0 in a report written before the field
			lp.Burst = lp.ContendedBurst
		}
	}
	return lp
}

func defaultLoadParams(quick bool) loadParams {
	p := loadParams{
		Live:           1 << 30,
		Burst:          512 << 20,
		ContendedBurst: 32 << 20,
		Period:         10 * time.Second,
		FirstBurst:     2 * time.Second,
		Check:          3500 * time.Millisecond,
		For:            62 * time.Second, // 6 bursts
		Rate:           200,
		ContendedRate:  50,
		Alloc:          16 << 10,
		Timeout:        10 * time.Second,
		MaxInFlight:    2000,
		CgroupLimit:    4 << 30,
		Quota:          10000,
		QuotaPeriod:    100000,
		// A natural GC cycle about every 0.3 s: one collects each burst
		// before the trim's 2 s delay.
		GCPercent: 10,
		GCLive:    256 << 20,
		GCAlloc:   256 << 10,
	}
	if quick {
		p.For = 8 * time.Second // one burst
	}
	return p
}

// loadArms: the GOMEMLIMIT-only arm adds nothing to what a trim costs.
var loadArms = []string{"plain", "memctl", "memctl-aa"}

var loadFigures = []figureDef{
	{"p50", "p50 latency", unitLatency},
	{"p99", "p99 latency", unitLatency},
	{"p999", "p99.9 latency", unitLatency},
	{"p99_vs_plain", "p99 / plain's p99 (same round)", unitRatio},
	{"p99_trim", "p99 of requests overlapping a trim", unitLatency},
	{"p99_clear", "p99 of the other requests", unitLatency},
	{"p99_trim_ratio", "p99 overlapping a trim / p99 of the others (same run)", unitRatio},
	{"p99_placebo_ratio", "the same for windows without a trim (trims' windows + half the burst period): its A/A", unitRatio},
	{"overlapping", "requests overlapping a trim", unitCount},
	{"failed", "failed requests", unitCount},
	{"trims", "trims run", unitCount},
	{"gc_cycles", "GC cycles (forced ones included)", unitCount},
	{"gc_forced", "forced GC cycles (/gc/cycles/forced:gc-cycles)", unitCount},
	{"trim_cpu_share", "trim CPU / wall time", unitFraction},
	{"mean_rss", "mean RSS (MiB)", unitBytes},
	{"bursts_back", "bursts with RSS < 1.2 × pre-burst 3.5 s after", unitFraction},
}

func loadScenario(name string) scenario {
	return scenario{
		Name:    name,
		Figures: loadFigures,
		arms:    loadArms,
		cgroupLimit: func(p params) int64 {
			return p.Load.CgroupLimit
		},
		title: func(p params) string {
			lp := variantParams(name, p.Load)
			var t string
			switch name {
			case "load":
				t = fmt.Sprintf("a server holding %s MiB live, %s requests/s open-loop on loopback", mibs(lp.Live), thousands(lp.Rate))
			case "load-gc":
				t = fmt.Sprintf("the server of load with GOGC=%d, %s MiB live and %s KiB of garbage per request (natural GC cycles collect each burst before its trim), %s requests/s",
					lp.GCPercent, mibs(lp.Live), thousands(float64(lp.Alloc>>10)), thousands(lp.Rate))
			case "load-contended":
				t = fmt.Sprintf("the server of load in a cgroup v1 cpu child with a %d%% CPU quota (cfs_quota_us %d / cfs_period_us %d) shared with a busy loop, %s requests/s",
					100*lp.Quota/lp.QuotaPeriod, lp.Quota, lp.QuotaPeriod, thousands(lp.Rate))
			}
			t = fmt.Sprintf("%s: %s, a %s MiB burst every %s, for %s", name, t, mibs(lp.Burst), secs(lp.Period), secs(lp.For))
			if p.TrimDelay > 0 {
				t += fmt.Sprintf("; memctl arms with a %s trim delay (-trim-delay)", secs(p.TrimDelay))
			}
			return t + fmt.Sprintf(" (each arm's memory cgroup, where used: %s MiB)", mibs(lp.CgroupLimit))
		},
		setup: func(p params) {
			if name == "load-gc" {
				debug.SetGCPercent(p.Load.GCPercent)
			}
		},
		child: func(p params, st *armState, c *childIO) (childResult, error) {
			return loadChild(variantParams(name, p.Load), p, st, c)
		},
		observe: func(pr *proc, p params) (map[string]Obs, Trace) {
			return observeLoad(pr, p, name)
		},
		derive: func(obs map[string]map[string][]Obs) { deriveRatio(obs, "p99", "p99_vs_plain") },
		precheck: func() error {
			if name != "load-contended" {
				return nil
			}
			g, err := cpuquota.New(fmt.Sprintf("memctl-bench-cpu%s-%d-probe", tagSuffix(), os.Getpid()), 100000, 100000)
			if err != nil {
				return err
			}
			return g.Remove()
		},
	}
}

var (
	loadScenarioPlain     = loadScenario("load")
	loadScenarioContended = loadScenario("load-contended")
	loadScenarioGC        = loadScenario("load-gc")
)

// loadNode is a small pointer-linked node of the server's live set.
type loadNode struct {
	next *loadNode
	_    [7]int64 // 64 bytes in all
}

// loadChild is the server: it says "addr HOST:PORT" before "ready", and
// after "go" runs a burst every Period.
func loadChild(lp loadParams, p params, st *armState, c *childIO) (childResult, error) {
	var r childResult
	live := burst.Alloc(lp.Live / 16 * 15)
	var nodes *loadNode
	for range lp.Live / 16 / 64 {
		nodes = &loadNode{next: nodes}
	}
	defer runtime.KeepAlive(nodes)
	defer runtime.KeepAlive(live)
	runtime.GC()
	time.Sleep(settle)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return r, err
	}
	srv := &http.Server{Handler: handler(lp.Alloc), ReadHeaderTimeout: lp.Timeout}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	if err := c.say("addr " + ln.Addr().String()); err != nil {
		return r, err
	}
	if err := c.handshake(); err != nil {
		return r, err
	}
	start := time.Now()
	gc0, forced0 := gcCycles()
	back, n := 0, 0
	for at := start.Add(lp.FirstBurst); !at.Add(lp.Check).After(start.Add(lp.For)); at = at.Add(lp.Period) {
		time.Sleep(time.Until(at))
		pre, err := procfs.RSS(0)
		if err != nil {
			return r, err
		}
		b := burst.Alloc(lp.Burst)
		runtime.KeepAlive(b) // live until here, garbage from here on
		st.afterBurst()
		time.Sleep(lp.Check)
		post, err := procfs.RSS(0)
		if err != nil {
			return r, err
		}
		n++
		if float64(post) < 1.2*float64(pre) {
			back++
		}
	}
	time.Sleep(time.Until(start.Add(lp.For)))
	r.Elapsed = time.Since(start)
	gc, forced := gcCycles()
	r.Extra = map[string]float64{"gc_cycles": gc - gc0, "gc_forced": forced - forced0}
	if n > 0 {
		r.Extra["bursts_back"] = float64(back) / float64(n)
	}
	if err := st.snapshot(&r); err != nil {
		return r, err
	}
	r.Extra["trims"], r.Extra["trim_cpu_share"] = float64(r.Trims), r.TrimCPU.Seconds()/r.Elapsed.Seconds()
	return r, c.end()
}

// observeLoad runs the load generator against pr's server (in the
// contended variant after moving it into the CPU-quota cgroup) and samples
// its RSS; the trace holds the RSS and the p99 per p99Window.
func observeLoad(pr *proc, p params, name string) (map[string]Obs, Trace) {
	lp := variantParams(name, p.Load)
	line := pr.next(startTimeout, "its address")
	addr, ok := strings.CutPrefix(line, "addr ")
	if pr.fail == nil && !ok {
		pr.fail = pr.failure(fmt.Sprintf("said %q, want its address", line))
	}
	pr.expect("ready", startTimeout)
	if name == "load-contended" && pr.fail == nil {
		name := fmt.Sprintf("memctl-bench-cpu%s-%d-%s", tagSuffix(), os.Getpid(), strings.ReplaceAll(pr.spec, "/", "-"))
		pr.check(pr.enterQuota(name, lp.Quota, lp.QuotaPeriod))
	}
	start := time.Now()
	pr.send("go")
	if pr.fail != nil {
		return nil, Trace{}
	}
	stop := pr.sampleInBackground(start, p.Sample, lp.For+time.Minute)
	lat, failed, sent := openLoop("http://"+addr+"/", lp.Rate, lp.For, lp.Timeout, lp.MaxInFlight)
	pr.expect("end", lp.For+2*time.Minute)
	samples := stop()
	r := pr.finish()
	tr := rssTrace(start, samples)
	tr.P99 = p99Windows(lat, lp.Rate, sent.Sub(start).Seconds(), p99Window)
	figs := map[string]Obs{"failed": {Value: float64(failed)}, "mean_rss": meanRSS(samples)}
	spans := r.TrimSpans
	figs["p99_trim"], figs["p99_clear"], figs["p99_trim_ratio"], figs["overlapping"] = overlapFigures(lat, sent, lp.Rate, spans, nil)
	_, _, figs["p99_placebo_ratio"], _ = overlapFigures(lat, sent, lp.Rate, shiftSpans(spans, lp.Period/2, sent.UnixNano(), sent.Add(lp.For).UnixNano()), spans)
	slices.Sort(lat)
	figs["p50"] = Obs{Value: percentile(lat, 50)}
	figs["p99"] = Obs{Value: percentile(lat, 99)}
	figs["p999"] = Obs{Value: percentile(lat, 99.9)}
	return figs, tr
}

// openLoop sends rate requests per second to url for d, each at its due
// time (start + i/rate) whatever the server's pace, and returns each one's
// latency in seconds from its due time (timeout if failed: an error, not
// 200, or maxInFlight outstanding when due), the failures and start.
func openLoop(url string, rate float64, d, timeout time.Duration, maxInFlight int) ([]float64, int, time.Time) {
	n := int(rate * d.Seconds())
	lat := make([]float64, n)
	var failed atomic.Int64
	tr := &http.Transport{MaxIdleConnsPerHost: maxInFlight, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: timeout}
	sem := make(chan struct{}, maxInFlight)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		due := start.Add(time.Duration(float64(i) / rate * 1e9))
		time.Sleep(time.Until(due))
		lat[i] = timeout.Seconds() // until it succeeds
		select {
		case sem <- struct{}{}:
		default:
			failed.Add(1)
			continue
		}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := get(client, url); err != nil {
				failed.Add(1)
				return
			}
			lat[i] = time.Since(due).Seconds()
		})
	}
	wg.Wait()
	return lat, int(failed.Load()), start
}

// gcCycles returns the GC cycles run so far, and how many were forced.
func gcCycles() (total, forced float64) {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}, {Name: "/gc/cycles/forced:gc-cycles"}}
	metrics.Read(s)
	return float64(s[0].Value.Uint64()), float64(s[1].Value.Uint64())
}

// tagSuffix is "-"+MEMCTL_BENCH_TAG when that is set, for cgroup names.
func tagSuffix() string {
	if t := os.Getenv("MEMCTL_BENCH_TAG"); t != "" {
		return "-" + t
	}
	return ""
}

// scenarioNames lists the scenarios, comma-separated.
func scenarioNames() string {
	var names []string
	for _, s := range scenarios {
		names = append(names, s.Name)
	}
	return strings.Join(names, ",")
}

// A trim's latency cost is measured within one arm: the p99 of requests
// overlapping a trim against the others' (docs/benchmarks.md says why).

// span is a trim's wall-clock interval in Unix nanoseconds (CLOCK_REALTIME,
// the same in parent and child).
type span [2]int64

// overlapFigures splits the requests (the i-th due at start + i/rate,
// taking lat[i] seconds) that overlap none of exclude into those whose
// [due, due+latency] overlaps one of spans and the rest, and returns the
// p99 of each, their ratio and how many overlapped; NA with no span or an
// empty side.
func overlapFigures(lat []float64, start time.Time, rate float64, spans, exclude []span) (overlap, clear, ratio, n Obs) {
	na := Obs{NA: true}
	if len(spans) == 0 {
		return na, na, na, Obs{Value: 0}
	}
	var in, out []float64
	t0 := start.UnixNano()
	for i, l := range lat {
		due := t0 + int64(float64(i)/rate*1e9)
		end := due + int64(l*1e9)
		switch {
		case overlaps(exclude, due, end):
		case overlaps(spans, due, end):
			in = append(in, l)
		default:
			out = append(out, l)
		}
	}
	n = Obs{Value: float64(len(in))}
	if len(in) == 0 || len(out) == 0 {
		return na, na, na, n
	}
	slices.Sort(in)
	slices.Sort(out)
	po, pc := percentile(in, 99), percentile(out, 99)
	overlap, clear = Obs{Value: po}, Obs{Value: pc}
	if pc > 0 {
		ratio = Obs{Value: po / pc}
	} else {
		ratio = na
	}
	return overlap, clear, ratio, n
}

// overlaps reports whether [from, to] meets one of spans.
func overlaps(spans []span, from, to int64) bool {
	for _, sp := range spans {
		if sp[0] <= to && sp[1] >= from {
			return true
		}
	}
	return false
}

// shiftSpans returns spans moved by d, the A/A's placebo windows. A window
// that would leave [lo, hi] or meet a real trim is moved by -d, then ±d/2
// instead (so a quick run's one trim gets one); if none fits it stays
// moved by d, and its figure is NA.
func shiftSpans(spans []span, d time.Duration, lo, hi int64) []span {
	out := make([]span, len(spans))
	for i, s := range spans {
		out[i] = span{s[0] + int64(d), s[1] + int64(d)}
		for _, m := range []time.Duration{d, -d, d / 2, -d / 2} {
			c := span{s[0] + int64(m), s[1] + int64(m)}
			if c[0] >= lo && c[1] <= hi && !overlaps(spans, c[0], c[1]) {
				out[i] = c
				break
			}
		}
	}
	return out
}
