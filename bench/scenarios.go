package main

import (
	"fmt"
	"github.com/memctl/memctl/internal/burst"
	"io"
	"net"
	"net/http"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memctl/memctl/limits"
)

// params are the scenarios' sizes (bytes) and times; the parent passes
// them to each child as JSON.
type params struct {
	Live   int64         `json:"live_bytes"`  // the live heap every child keeps
	Burst  int64         `json:"burst_bytes"` // the burst scenario's burst
	Window time.Duration `json:"window"`      // how long RSS is observed after it
	Sample time.Duration `json:"sample"`      // the interval between RSS readings
	// The cadence scenario's bursts, their spacing and its window.
	CadenceBurst  int64         `json:"cadence_burst_bytes"`
	CadencePeriod time.Duration `json:"cadence_period"`
	CadenceFor    time.Duration `json:"cadence_for"`
	// The http scenario's measured requests (after Warmup), connections,
	// bytes each request charges, and budget per request (memctl arms).
	Requests int        `json:"requests"`
	Warmup   int        `json:"warmup"`
	Clients  int        `json:"clients"`
	Alloc    int64      `json:"request_alloc_bytes"`
	Budget   int64      `json:"request_budget_bytes"`
	Load     loadParams `json:"load"`
	// TrimDelay, when not 0, is the memctl arms' memctl.WithTrimDelay.
	TrimDelay time.Duration `json:"trim_delay,omitempty"`
}

// defaultParams are the full run's; quick shortens the windows and the
// request count.
func defaultParams(quick bool) params {
	p := params{
		Live:          20 << 20,
		Burst:         1 << 30,
		Window:        30 * time.Second,
		Sample:        50 * time.Millisecond,
		CadenceBurst:  64 << 20,
		CadencePeriod: 2100 * time.Millisecond,
		CadenceFor:    60 * time.Second,
		Requests:      100_000,
		Warmup:        2_000,
		Clients:       8,
		Alloc:         32 << 10,
		Budget:        1 << 20,
	}
	p.Load = defaultLoadParams(quick)
	if quick {
		p.Window = 3500 * time.Millisecond
		// 2.5 s apart: the first burst's trim lands before the second.
		p.CadencePeriod, p.CadenceFor = 2500*time.Millisecond, 5*time.Second
		p.Requests, p.Warmup = 10_000, 500
	}
	return p
}

// figureDef is one row of a scenario's table.
type figureDef struct {
	Key   string
	Label string
	Unit  unit
}

// scenario is one workload: its child side (run in each arm's process) and
// its parent side (which observes the child from /proc). The func fields
// after complete are optional.
type scenario struct {
	Name    string
	Figures []figureDef
	title   func(p params) string // the table's heading
	child   func(p params, st *armState, c *childIO) (childResult, error)
	// observe runs in the parent while the child runs and returns the
	// figures it measured and the run's trace; it may call pr.finish for the
	// child's result, and runOne reads pr.fail.
	observe func(pr *proc, p params) (map[string]Obs, Trace)
	arms    []string // keys of the arms it runs
	// cgroupLimit is the arms' cgroup limit where above -cgroup-limit's.
	cgroupLimit func(p params) int64
	derive      func(obs map[string]map[string][]Obs) // figures across arms, per round
	setup       func(p params)                        // in the child, before the arm's setup
	// precheck says why the scenario cannot run here; the report notes it
	// and the run goes on.
	precheck func() error
}

// runs reports whether the scenario runs arm a.
func (s scenario) runs(a arm) bool { return slices.Contains(s.arms, a.Key) }

var scenarios = []scenario{burstScenario, cadenceScenario, httpScenario, loadScenarioPlain, loadScenarioContended, loadScenarioGC}

func scenarioByName(name string) (scenario, bool) {
	return find(scenarios, func(s scenario) bool { return s.Name == name })
}

// burst: 20 MiB live, one 1 GiB burst, then idle.
var burstScenario = scenario{
	Name: "burst",
	Figures: []figureDef{
		{"rss_before", "RSS before (MiB)", unitBytes},
		{"peak_rss", "peak RSS (MiB)", unitBytes},
		{"rss_3s", "RSS 3 s after (MiB)", unitBytes},
		{"rss_10s", "RSS 10 s after (MiB)", unitBytes},
		{"back_within_10pct", "back within 10%", unitSeconds},
	},
	arms: burstArms,
	title: func(p params) string {
		return fmt.Sprintf("burst: %s MiB live, one %s MiB burst, then idle for %s", mibs(p.Live), mibs(p.Burst), secs(p.Window))
	},
	child: func(p params, st *armState, c *childIO) (childResult, error) {
		var r childResult
		defer runtime.KeepAlive(holdLive(p.Live))
		if err := c.handshake(); err != nil {
			return r, err
		}
		start := time.Now()
		b := burst.Alloc(p.Burst)
		runtime.KeepAlive(b) // all of it live until here, garbage from here on
		st.afterBurst()
		r.Elapsed = time.Since(start)
		if err := c.end(); err != nil {
			return r, err
		}
		return r, st.snapshot(&r)
	},
	observe: func(pr *proc, p params) (map[string]Obs, Trace) {
		pr.expect("ready", startTimeout)
		before, readAt := pr.status("VmRSS"), time.Now()
		pr.resetPeak()
		pr.send("go")
		end := pr.expect("end", 2*time.Minute)
		peak := pr.status("VmHWM")
		samples := pr.sample(end, p.Sample, p.Window)
		at := []sample{{at: readAt.Sub(end).Seconds(), rss: before}, {at: 0, rss: peak}}
		return burstFigures(before, peak, samples, p.Window), rssTrace(end, append(at, samples...))
	},
}

// burstFigures computes the burst scenario's figures (samples: at in
// seconds after the burst's end).
func burstFigures(before, peak int64, samples []sample, window time.Duration) map[string]Obs {
	return map[string]Obs{
		"rss_before":        {Value: float64(before)},
		"peak_rss":          {Value: float64(peak)},
		"rss_3s":            rssAt(samples, 3),
		"rss_10s":           rssAt(samples, 10),
		"back_within_10pct": backWithin(samples, before, 0.10, window.Seconds()),
	}
}

// cadence: the worst burst spacing for a 2 s trim delay.
var cadenceScenario = scenario{
	Name: "cadence",
	arms: defaultArms,
	Figures: []figureDef{
		{"trims", "trims run", unitCount},
		{"trim_share", "wall time in trims", unitFraction},
		{"mean_rss", "mean RSS (MiB)", unitBytes},
		{"peak_rss", "peak RSS (MiB)", unitBytes},
	},
	title: func(p params) string {
		return fmt.Sprintf("cadence: %s MiB live, a %s MiB burst every %s for %s", mibs(p.Live), mibs(p.CadenceBurst), secs(p.CadencePeriod), secs(p.CadenceFor))
	},
	child: func(p params, st *armState, c *childIO) (childResult, error) {
		var r childResult
		defer runtime.KeepAlive(holdLive(p.Live))
		if err := c.handshake(); err != nil {
			return r, err
		}
		start := time.Now()
		for at := start; at.Before(start.Add(p.CadenceFor)); at = at.Add(p.CadencePeriod) {
			time.Sleep(time.Until(at))
			b := burst.Alloc(p.CadenceBurst)
			runtime.KeepAlive(b)
			st.afterBurst()
		}
		time.Sleep(time.Until(start.Add(p.CadenceFor)))
		r.Elapsed = time.Since(start)
		if err := st.snapshot(&r); err != nil {
			return r, err
		}
		r.Extra = map[string]float64{"trims": float64(r.Trims), "trim_share": r.TrimTime.Seconds() / r.Elapsed.Seconds()}
		return r, c.end()
	},
	observe: func(pr *proc, p params) (map[string]Obs, Trace) {
		pr.expect("ready", startTimeout)
		pr.resetPeak()
		start := time.Now()
		pr.send("go")
		stop := pr.sampleInBackground(start, p.Sample, p.CadenceFor+time.Minute)
		pr.expect("end", p.CadenceFor+time.Minute)
		samples := stop()
		peak := pr.status("VmHWM")
		return map[string]Obs{"mean_rss": meanRSS(samples), "peak_rss": {Value: float64(peak)}}, rssTrace(start, samples)
	},
}

// http: a loopback net/http server and an in-process load generator.
var httpScenario = scenario{
	Name: "http",
	arms: defaultArms,
	Figures: []figureDef{
		{"rps", "requests per second", unitRate},
		{"p50", "p50 latency", unitLatency},
		{"p99", "p99 latency", unitLatency},
		{"rps_vs_plain", "requests per second / plain (same round)", unitRatio},
	},
	title: func(p params) string {
		return fmt.Sprintf("http: %s requests (after %s warm-up) over %d loopback connections; each request allocates %s KiB and charges it to its budget",
			thousands(float64(p.Requests)), thousands(float64(p.Warmup)), p.Clients, thousands(float64(p.Alloc>>10)))
	},
	child:  httpChild,
	derive: func(obs map[string]map[string][]Obs) { deriveRatio(obs, "rps", "rps_vs_plain") },
	observe: func(pr *proc, p params) (map[string]Obs, Trace) {
		pr.expect("ready", startTimeout)
		pr.send("go")
		pr.expect("end", 10*time.Minute)
		return map[string]Obs{}, Trace{}
	},
}

// httpChild serves handler(p.Alloc), behind Pool.Middleware in the memctl
// arms.
func httpChild(p params, st *armState, c *childIO) (childResult, error) {
	var r childResult
	h := handler(p.Alloc)
	if st.arm.memctl() {
		pool, err := limits.NewPool(limits.PoolConfig{Name: "bench"})
		if err != nil {
			return r, err
		}
		st.pool = pool
		mw, err := pool.Middleware(limits.HTTPConfig{Limit: p.Budget, AfterBurst: st.afterBurst})
		if err != nil {
			return r, err
		}
		h = mw(h)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return r, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	tr := &http.Transport{MaxIdleConnsPerHost: p.Clients, MaxConnsPerHost: p.Clients, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: time.Minute}
	url := "http://" + ln.Addr().String() + "/"
	if _, _, err := load(client, url, p.Warmup, p.Clients); err != nil {
		return r, fmt.Errorf("warm-up: %w", err)
	}
	if err := c.handshake(); err != nil {
		return r, err
	}
	lat, elapsed, err := load(client, url, p.Requests, p.Clients)
	if err != nil {
		return r, err
	}
	slices.Sort(lat)
	r.Elapsed = elapsed
	r.Extra = map[string]float64{"rps": float64(len(lat)) / elapsed.Seconds(), "p50": percentile(lat, 50), "p99": percentile(lat, 99)}
	if err := st.snapshot(&r); err != nil {
		return r, err
	}
	return r, c.end()
}

// handler charges alloc bytes to the request's budget (limits.Grow counts
// nothing without an account), allocates them, touches each page and
// answers the first KiB; a refusal is answered with limits.WriteError.
func handler(alloc int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		ctx := req.Context()
		if err := limits.Grow(ctx, alloc); err != nil {
			if !limits.WriteError(w, err) {
				http.Error(w, err.Error(), http.StatusInternalServerError)
			}
			return
		}
		defer limits.Shrink(ctx, alloc)
		buf := make([]byte, alloc)
		for i := 0; i < len(buf); i += 4096 {
			buf[i] = byte(i >> 12)
		}
		_, _ = w.Write(buf[:min(len(buf), 1024)])
	})
}

// load sends n GET requests to url over clients connections and returns
// each one's latency in seconds and the total wall time; an answer other
// than 200 is an error.
func load(client *http.Client, url string, n, clients int) ([]float64, time.Duration, error) {
	lat := make([]float64, n)
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				t0 := time.Now()
				if err := get(client, url); err != nil {
					once.Do(func() { firstErr = err })
					next.Store(int64(n)) // stop the others
					return
				}
				lat[i] = time.Since(t0).Seconds()
			}
		})
	}
	wg.Wait()
	return lat, time.Since(start), firstErr
}

// get sends a GET request to url and reads the answer; one other than 200
// is an error.
func get(client *http.Client, url string) error {
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("status %s", resp.Status)
	}
	return err
}

// startTimeout bounds a child's start-up, until it reports ready.
const startTimeout = time.Minute

func mibs(b int64) string { return thousands(float64(b >> 20)) }
