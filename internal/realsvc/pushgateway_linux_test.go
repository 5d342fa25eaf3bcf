package realsvc

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// The Pushgateway workload, in a 256 MiB cgroup per arm.
const (
	pgLimit = 256 << 20
	// pgBurst is the large push: about 200,000 series, which Pushgateway
	// parses into about 150 MiB; pgOversized is larger than the budget
	// variant's per-request budget (48 MiB, testdata/pushgateway).
	pgBurst, pgOversized = 15 << 20, 60 << 20
	pgSmallEvery         = 50 * time.Millisecond
	pgScrapeEvery        = 5 * time.Second
	// pgWarm is the time under the small load before the large push,
	// which is sent when the first scrape after it has been answered (so
	// that the next scrape is 5 s later).
	pgWarm = 7 * time.Second
	// pgAfter is when RSS is checked after the delete took effect (the
	// README promises the trim 2 s after a burst); pgWatch is how long RSS
	// is followed after it, to say when it came back.
	pgAfter = 5 * time.Second
	pgWatch = 10 * time.Second
	// trimDelay is memctl's delay from a burst's mark to its trim
	// (README).
	trimDelay = 2 * time.Second
	// pgKeep is the share of the burst's rise that may still be resident
	// pgAfter after the delete.
	pgKeep = 0.25
)

type sample struct {
	at  time.Time
	rss int64
}

// pgArm is one Pushgateway with its load: small pushes every 50 ms, a
// scrape every 5 s, and VmRSS sampled every 100 ms.
type pgArm struct {
	*arm
	url string

	mu      sync.Mutex
	rss     []sample
	pushes  []pushed
	scrapes []span
	// scraping is when the scrape in flight was sent; zero when none is.
	scraping time.Time
}

// span is when one request was sent and when its answer was read.
type span struct{ from, to time.Time }

type pushed struct {
	at time.Time
	ok bool
}

// load starts the arm's small pushes, scrapes and RSS samples until ctx
// ends. A request waits for its answer however long it takes:
// Pushgateway's store takes writes one at a time, and a client that gave
// up would leave its push queued there while sending the next.
func (p *pgArm) load(ctx context.Context, wg *sync.WaitGroup) {
	small := smallBody()
	c := &http.Client{}
	every := func(d time.Duration, f func(time.Time)) {
		wg.Go(func() {
			tick := time.NewTicker(d)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case now := <-tick.C:
					f(now)
				}
			}
		})
	}
	every(pgSmallEvery, func(now time.Time) {
		code, _ := do(ctx, c, http.MethodPut, p.url+"/metrics/job/small/instance/realsvc", small)
		p.mu.Lock()
		p.pushes = append(p.pushes, pushed{now, code == http.StatusOK})
		p.mu.Unlock()
	})
	every(pgScrapeEvery, func(now time.Time) {
		p.mu.Lock()
		p.scraping = now
		p.mu.Unlock()
		code, _ := do(ctx, c, http.MethodGet, p.url+"/metrics", nil)
		p.mu.Lock()
		if code == http.StatusOK {
			p.scrapes = append(p.scrapes, span{now, time.Now()})
		}
		p.scraping = time.Time{}
		p.mu.Unlock()
	})
	every(100*time.Millisecond, func(now time.Time) {
		if s, err := ReadStatus(p.pid()); err == nil {
			p.mu.Lock()
			p.rss = append(p.rss, sample{now, s.VmRSS})
			p.mu.Unlock()
		}
	})
}

// do sends one request with body and reads the whole answer; code is 0
// with the error when there is none.
func do(ctx context.Context, c *http.Client, method, url string, body []byte) (int, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, r)
	if err != nil {
		return 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, err
}

// smallBody is a small push: 20 gauges.
func smallBody() []byte {
	var b bytes.Buffer
	b.WriteString("# TYPE realsvc_small gauge\n")
	for i := range 20 {
		fmt.Fprintf(&b, "realsvc_small{k=\"%02d\"} %d\n", i, i)
	}
	return b.Bytes()
}

// bigBody is a push of size bytes: one gauge family of series with two
// labels, about 80 bytes each (15 MiB: 200,000 series, parsed into about
// 150 MiB).
func bigBody(size int) []byte {
	var b bytes.Buffer
	b.Grow(size + 100)
	b.WriteString("# TYPE realsvc_big gauge\n")
	for i := 0; b.Len() < size; i++ {
		fmt.Fprintf(&b, "realsvc_big{instance=\"host-%06d.realsvc.example:9100\",series=\"%09d\"} %d\n", i%100000, i, i)
	}
	return b.Bytes()
}

// nextScrape waits until a scrape sent from now on has been answered, at
// most timeout.
func (p *pgArm) nextScrape(timeout time.Duration) {
	now := time.Now()
	for end := now.Add(timeout); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		p.mu.Lock()
		n := len(p.scrapes)
		done := n > 0 && p.scrapes[n-1].from.After(now)
		p.mu.Unlock()
		if done {
			return
		}
	}
}

// window returns the samples in [from, to).
func (p *pgArm) window(from, to time.Time) []sample {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []sample
	for _, s := range p.rss {
		if !s.at.Before(from) && s.at.Before(to) {
			out = append(out, s)
		}
	}
	return out
}

// burst is what one arm did around the large push and its delete.
type burst struct {
	push, del                      int
	pushAt, pushed, delAt, deleted time.Time
	// died is when the large push's data was last referenced: when the
	// delete took effect, or the end of a scrape that read the group.
	died                      time.Time
	before, peak, after, keep int64
	back                      time.Duration // -1: not back within pgWatch
	fateOK                    bool
	fate                      string
}

func (b burst) String() string {
	back := fmt.Sprintf("back at %.1f s", b.back.Seconds())
	if b.back < 0 {
		back = fmt.Sprintf("not back in %.0f s", pgWatch.Seconds())
	}
	return fmt.Sprintf("%.0f -> %.0f -> %.0f MiB, %s", mib(b.before), mib(b.peak), mib(b.after), back)
}

// timeline describes the arm's burst in seconds from the large push's
// start: its answer, the delete, the scrapes around them, and RSS every
// half second.
func (p *pgArm) timeline(b burst) string {
	rel := func(at time.Time) string { return fmt.Sprintf("%+.1f", at.Sub(b.pushAt).Seconds()) }
	var w strings.Builder
	fmt.Fprintf(&w, "answered at %s s, delete sent at %s s, in effect at %s s, data dead at %s s; scrapes", rel(b.pushed), rel(b.delAt), rel(b.deleted), rel(b.died))
	p.mu.Lock()
	for _, s := range p.scrapes {
		if s.to.After(b.pushAt.Add(-time.Second)) && s.from.Before(b.died.Add(pgWatch)) {
			fmt.Fprintf(&w, " %s..%s", rel(s.from), rel(s.to))
		}
	}
	p.mu.Unlock()
	w.WriteString(" s; RSS MiB every 0.5 s from -1 s:")
	next := b.pushAt.Add(-time.Second)
	for _, s := range p.window(next, b.died.Add(pgWatch)) {
		if !s.at.Before(next) {
			fmt.Fprintf(&w, " %d", s.rss>>20)
			next = next.Add(500 * time.Millisecond)
		}
	}
	return w.String()
}

// dead sets b.died once no scrape sent before the delete took effect is
// still in flight (waiting at most a minute for it).
func (p *pgArm) dead(b *burst) {
	for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		p.mu.Lock()
		busy := !p.scraping.IsZero() && p.scraping.Before(b.deleted)
		p.mu.Unlock()
		if !busy {
			break
		}
	}
	b.died = b.deleted
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.scrapes {
		if s.from.Before(b.deleted) && s.to.After(b.pushed) {
			b.died = maxTime(b.died, s.to)
		}
	}
}

// measure reads the arm's samples around its burst.
func (p *pgArm) measure(b *burst) error {
	pre := p.window(b.pushAt.Add(-2*time.Second), b.pushAt)
	during := p.window(b.pushAt, b.died.Add(pgAfter))
	post := p.window(b.died.Add(pgAfter), b.died.Add(pgWatch))
	if len(pre) < 5 || len(during) < 10 || len(post) == 0 {
		return fmt.Errorf("too few RSS samples (%d before, %d during, %d after)", len(pre), len(during), len(post))
	}
	rss := func(ss []sample) []int64 {
		var out []int64
		for _, s := range ss {
			out = append(out, s.rss)
		}
		return out
	}
	before := rss(pre)
	slices.Sort(before)
	b.before = before[len(before)/2]
	b.peak = slices.Max(rss(during))
	b.after = post[0].rss
	b.keep = b.before + int64(pgKeep*float64(b.peak-b.before))
	b.back = -1
	for _, s := range p.window(b.died, b.died.Add(pgWatch)) {
		if s.rss <= b.keep {
			b.back = s.at.Sub(b.died)
			break
		}
	}
	return nil
}

// testPushgateway runs Pushgateway plain, with the auto import and with
// Start and the budget middleware, each in a 256 MiB cgroup, all with the
// same load at the same time; checks RSS 5 s after the large push's
// delete, OOM kills and CPU, then sends the oversized push.
func testPushgateway(t *testing.T, b Builds, tab *Table) {
	arms := []*pgArm{{arm: newArm(t, "plain", pgLimit)}, {arm: newArm(t, "auto", pgLimit)}, {arm: newArm(t, "budget", pgLimit)}}
	bins := map[string]string{"plain": b.PushgatewayPlain, "auto": b.PushgatewayAuto, "budget": b.PushgatewayBudget}
	start := time.Now()
	for _, a := range arms {
		port := freePort(t)
		a.url = fmt.Sprintf("http://127.0.0.1:%d", port)
		a.start(t, t.TempDir(), bins[a.name], fmt.Sprintf("--web.listen-address=127.0.0.1:%d", port))
	}
	for _, a := range arms {
		if err := waitHTTP(a.arm, a.url+"/-/ready", 30*time.Second); err != nil {
			t.Fatalf("realsvc: pushgateway %v\n%s", err, a.tail(20))
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for _, a := range arms {
		a.load(ctx, &wg)
	}
	time.Sleep(pgWarm)
	bursts := pgBursts(ctx, t, arms)
	wall := time.Since(start)
	cpu := make([]time.Duration, len(arms))
	for i, a := range arms {
		var err error
		if cpu[i], err = CPUTime(a.pid()); err != nil && a.alive() {
			t.Errorf("realsvc: pushgateway %s: %v", a.name, err)
		}
		bursts[i].fateOK, bursts[i].fate = a.fate(t)
		if err := a.measure(&bursts[i]); err != nil {
			t.Errorf("realsvc: pushgateway %s: %v", a.name, err)
		}
		a.report(t, b.Memctl, bursts[i])
	}
	for i, a := range arms[1:] {
		pgBurstRows(t, tab, a.name, bursts[0], bursts[i+1])
		bound := cpuBound(cpu[0], wall)
		check(t, tab.Add(Row{Service: "pushgateway", Check: fmt.Sprintf("CPU over %.0f s (utime+stime)", wall.Seconds()), Arm: a.name,
			Plain: secs(cpu[0]), Value: secs(cpu[i+1]),
			Bound: fmt.Sprintf("<= %s (%.2f x plain + 2%% of %.0f s)", secs(bound), cpuRatio, wall.Seconds()), OK: cpu[i+1] <= bound}), "")
	}
	pgOversize(ctx, t, tab, arms)
}

// pgBursts sends the large push and its delete to every arm at once, each
// right after one of its scrapes, and returns when the data has died in
// each and pgWatch more has passed. The delete is answered before
// Pushgateway's store has done it: a push sent after it and answered (the
// store takes writes in order) says when it has.
func pgBursts(ctx context.Context, t *testing.T, arms []*pgArm) []burst {
	big := bigBody(pgBurst)
	bursts := make([]burst, len(arms))
	c := &http.Client{Timeout: 2 * time.Minute}
	var wg sync.WaitGroup
	for i, a := range arms {
		wg.Go(func() {
			b := &bursts[i]
			a.nextScrape(pgScrapeEvery + time.Second)
			b.pushAt = time.Now()
			b.push, _ = do(ctx, c, http.MethodPut, a.url+"/metrics/job/big", big)
			b.pushed = time.Now()
			b.del, _ = do(ctx, c, http.MethodDelete, a.url+"/metrics/job/big", nil)
			b.delAt = time.Now()
			if code, err := do(ctx, c, http.MethodPut, a.url+"/metrics/job/sync", smallBody()); code != http.StatusOK {
				t.Errorf("realsvc: pushgateway %s: the push after the delete: %d %v", a.name, code, err)
			}
			b.deleted = time.Now()
			a.dead(b)
		})
	}
	wg.Wait()
	last := bursts[0].died
	for _, b := range bursts {
		last = maxTime(last, b.died)
	}
	time.Sleep(time.Until(last.Add(pgWatch)))
	return bursts
}

// report logs the arm's burst, its timeline, and for a memctl variant what
// the library's record and log say.
func (p *pgArm) report(t *testing.T, memctlBin string, b burst) {
	t.Logf("realsvc: pushgateway %s: push %d, delete %d; %s", p.name, b.push, b.del, b)
	t.Logf("realsvc: pushgateway %s: %s", p.name, p.timeline(b))
	if p.name == "plain" {
		return
	}
	if r, err := ReadRecord(memctlBin, p.pid()); err != nil {
		t.Logf("realsvc: pushgateway %s: %v", p.name, err)
	} else {
		t.Logf("realsvc: pushgateway %s: memctl: GOMEMLIMIT %s, %d bursts detected, %d trims (%s released, %.0f ms CPU), %d skipped %v",
			p.name, MiB(r.GOMEMLIMIT.Bytes), r.AutoBurst.Bursts, r.Trim.Trims, MiB(r.Trim.ReleasedBytes), r.Trim.CPUSeconds*1000, r.Trim.Skipped, r.Trim.SkippedBy)
	}
	for _, l := range p.memctlLines(8) {
		t.Logf("realsvc: pushgateway %s: %s", p.name, l)
	}
}

// pgBurstRows adds the RSS and OOM rows of the memctl variant arm (m)
// beside plain.
func pgBurstRows(t *testing.T, tab *Table, arm string, plain, m burst) {
	issue, why := "", ""
	switch late := m.died.Sub(m.pushed); {
	case arm == "auto":
		issue, why = "34", "the import's trim skips a burst no GC has seen die"
	case late > trimDelay && m.after > m.keep:
		// The budget's mark is the large push's end: its trim may have
		// come before the data died, a burst no GC had seen die.
		issue, why = "34", fmt.Sprintf("the data died %.1f s after the push's answer, later than the trim due %s after it", late.Seconds(), trimDelay)
	}
	rose := m.push == http.StatusOK && m.peak-m.before >= 64<<20
	r := Row{Service: "pushgateway", Check: "RSS before -> peak -> 5 s after the 15 MiB push's delete", Arm: arm, Issue: issue,
		Plain: plain.String(), Value: m.String(),
		Bound: fmt.Sprintf("<= %.0f MiB (before + 25%% of the rise)", mib(m.keep)),
		OK:    rose && m.after <= m.keep}
	if !rose {
		r.Value = fmt.Sprintf("no burst to check: push answered %d, rise %s; %s", m.push, MiB(m.peak-m.before), m)
	}
	check(t, tab.Add(r), why)
	check(t, tab.Add(Row{Service: "pushgateway", Check: "OOM kill (15 MiB push)", Arm: arm, Plain: plain.fate, Value: m.fate,
		Bound: "none where plain has none", OK: m.fateOK || !plain.fateOK}), "")
}

// pgOversizeGrace is how long the other arms may take to answer the
// oversized push once the budget variant has: only the budget variant is
// judged, and a plain or auto arm that neither answers nor dies (GC at the
// limit) would otherwise hold the suite for the client's timeout.
const pgOversizeGrace = 5 * time.Second

// pgOversize sends the oversized push to every arm at once while the small
// pushes go on, and checks that the budget variant (arms[2]) answers 429
// and serves every small push meanwhile.
func pgOversize(ctx context.Context, t *testing.T, tab *Table, arms []*pgArm) {
	over := bigBody(pgOversized)
	c := &http.Client{Timeout: 2 * time.Minute}
	codes := make([]string, len(arms))
	others, cancel := context.WithCancel(ctx)
	defer cancel()
	at := time.Now()
	var wg sync.WaitGroup
	for i, a := range arms {
		wg.Go(func() {
			actx := others
			if i == 2 {
				actx = ctx
			}
			code, err := do(actx, c, http.MethodPut, a.url+"/metrics/job/huge", over)
			if i == 2 {
				time.AfterFunc(pgOversizeGrace, cancel)
			}
			codes[i] = fmt.Sprint(code)
			switch {
			case err != nil && i != 2 && others.Err() != nil:
				codes[i] = fmt.Sprintf("no answer %.0f s after the budget variant's", pgOversizeGrace.Seconds())
			case err != nil:
				codes[i] = "no answer (" + err.Error()[strings.LastIndex(err.Error(), ": ")+2:] + ")"
			}
		})
	}
	wg.Wait()
	time.Sleep(3 * time.Second)
	served := func(a *pgArm) (ok, all int) {
		a.mu.Lock()
		defer a.mu.Unlock()
		for _, p := range a.pushes {
			if !p.at.Before(at) {
				all++
				if p.ok {
					ok++
				}
			}
		}
		return ok, all
	}
	desc := func(i int) string {
		ok, all := served(arms[i])
		_, fate := arms[i].fate(t)
		return fmt.Sprintf("%s; small pushes %d/%d; %s", codes[i], ok, all, fate)
	}
	for i, a := range arms {
		t.Logf("realsvc: pushgateway %s: 60 MiB push %s", a.name, desc(i))
	}
	ok, all := served(arms[2])
	alive, _ := arms[2].fate(t)
	check(t, tab.Add(Row{Service: "pushgateway", Check: "60 MiB push (budget 48 MiB a push)", Arm: "budget",
		Plain: desc(0), Value: desc(2), Bound: "429, all small pushes served, alive",
		OK: codes[2] == "429" && all > 0 && ok == all && alive}), "")
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
