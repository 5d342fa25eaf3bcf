package limits

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func init() { children["undercharge"] = childUndercharge }

// TestChargeCheck: at GC end the live heap beyond its baseline is compared
// with what the accounts hold: far more (past the ratio and the floor) with
// work in flight is counted at every such cycle and said once at WARN with
// the figures; honest charges, a small excess, nothing in flight, or the
// check turned off say nothing.
func TestChargeCheck(t *testing.T) {
	var logs strings.Builder
	p := newTestPool(t, PoolConfig{Name: "http", Limit: 256 * mib, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	const gml = 240 * mib // floor: 30 MiB beyond the baseline
	assert.Equal(t, int64(-1), p.Stats().HeapBaseline)
	p.observeHeap(20*mib, gml) // nothing in flight: the baseline
	assert.Equal(t, 20*mib, p.Stats().HeapBaseline)

	a := mustOpen(t, p, "req-1", 64*mib)
	require.NoError(t, a.Grow(mib))
	p.observeHeap(45*mib, gml) // 25 MiB beyond: under the floor
	assert.Zero(t, p.Stats().Undercharged)
	p.observeHeap(60*mib, gml) // 40 MiB beyond, 1 MiB held: 40x
	p.observeHeap(80*mib, gml)
	st := p.Stats()
	assert.Equal(t, int64(2), st.Undercharged)
	assert.Equal(t, 1, strings.Count(logs.String(), "charges look too small"), logs.String())
	assert.Contains(t, logs.String(), "level=WARN")
	for _, f := range []string{"pool=http", "heap_live=62914560", "heap_baseline=20971520", "beyond_baseline=41943040", "accounted=1048576", "in_flight=1"} {
		assert.Contains(t, logs.String(), f)
	}

	// Honest charges: 15 MiB held for 40 MiB beyond is under 4x.
	require.NoError(t, a.Grow(14*mib))
	p.observeHeap(60*mib, gml)
	assert.Equal(t, int64(2), p.Stats().Undercharged)
	a.Shrink(15 * mib)
	a.Close()

	// A live heap under the baseline lowers it; nothing in flight resets it.
	b := mustOpen(t, p, "req-2", 64*mib)
	p.observeHeap(10*mib, gml)
	assert.Equal(t, 10*mib, p.Stats().HeapBaseline)
	b.Close()
	p.observeHeap(30*mib, gml)
	assert.Equal(t, 30*mib, p.Stats().HeapBaseline)
	assert.Equal(t, int64(2), p.Stats().Undercharged)

	// Without GOMEMLIMIT the floor is chargeCheckFloor, 16 MiB.
	c := mustOpen(t, p, "req-3", 64*mib)
	defer c.Close()
	p.observeHeap(45*mib, math.MaxInt64) // math.MaxInt64: no GOMEMLIMIT
	assert.Equal(t, int64(2), p.Stats().Undercharged, "15 MiB beyond: under the floor")
	p.observeHeap(47*mib, math.MaxInt64)
	assert.Equal(t, int64(3), p.Stats().Undercharged)

	off := newTestPool(t, PoolConfig{Limit: 256 * mib, ChargeRatio: -1})
	d := mustOpen(t, off, "req-1", 64*mib)
	defer d.Close()
	off.observeHeap(10*mib, gml)
	off.observeHeap(200*mib, gml)
	assert.Zero(t, off.Stats().Undercharged)
	assert.Equal(t, int64(-1), off.Stats().HeapBaseline)

	_, err := NewPool(PoolConfig{Limit: mib, ChargeRatio: math.NaN()})
	assert.ErrorContains(t, err, "ChargeRatio")
}

// childUndercharge serves, in a cgroup, one request whose handler builds
// rows of 1 KiB and charges 8 bytes for each (the README's 8·n with n
// rows), until the kernel kills it. The pool's WARN is printed with the
// live heap it saw, the GC cycles counted in PoolStats.Undercharged, and
// what the handler had built by then.
func childUndercharge() {
	if _, err := SetGoMemLimit(context.Background(), MemLimitConfig{}); err != nil {
		fmt.Println("ERROR=" + err.Error())
		return
	}
	var pool atomic.Pointer[Pool]
	var built atomic.Int64
	warned := make(chan struct{})
	h := &warnHook{Handler: slog.NewTextHandler(os.Stdout, nil), fn: func(r slog.Record) {
		if !strings.Contains(r.Message, "charges look too small") {
			return
		}
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "heap_live" {
				fmt.Printf("WARN_HEAP_LIVE=%d\n", a.Value.Int64())
			}
			return true
		})
		fmt.Printf("WARN_UNDERCHARGED=%d\nWARN_BUILT=%d\n", pool.Load().Stats().Undercharged, built.Load())
		close(warned)
	}}
	p, err := NewPool(PoolConfig{Name: "http", Logger: slog.New(h)})
	if err != nil {
		fmt.Println("ERROR=" + err.Error())
		return
	}
	pool.Store(p)
	fmt.Printf("GOMEMLIMIT=%d\nPOOL_LIMIT=%d\n", debug.SetMemoryLimit(-1), p.Limit())
	mw, _ := p.Middleware(HTTPConfig{Limit: 64 << 20})
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var rows [][]byte
		for {
			row := make([]byte, 1024)
			for i := range row {
				row[i] = byte(i)
			}
			rows = append(rows, row)
			if err := Grow(r.Context(), 8); err != nil { // 8 bytes a row: the mistake
				WriteError(w, err)
				return
			}
			built.Add(1024)
			if len(rows)%(16<<10) == 0 { // every 16 MiB
				s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
				metrics.Read(s)
				fmt.Printf("BUILT=%d HEAP_LIVE=%d\n", built.Load(), s[0].Value.Uint64())
			}
		}
	})))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		fmt.Println("ERROR=" + err.Error())
		return
	}
	body, _ := io.ReadAll(resp.Body)
	fmt.Printf("SURVIVED=%d %s\n", resp.StatusCode, body)
}

// warnHook is a slog.Handler that also calls fn for each record.
type warnHook struct {
	slog.Handler
	fn func(slog.Record)
}

func (h *warnHook) Handle(ctx context.Context, r slog.Record) error {
	h.fn(r)
	return h.Handler.Handle(ctx, r)
}

// TestUnderchargeWarnsInCgroup (issue 20): the handler that charges 8 bytes
// per 1 KiB row, in a 256 MiB cgroup with GOMEMLIMIT from it: budgets do
// not stop it (the heap watch refuses it at 90% of GOMEMLIMIT, or the
// kernel kills it), but the pool's WARN and its count in
// PoolStats.Undercharged come first, while the live heap is still well
// under the limit.
func TestUnderchargeWarnsInCgroup(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a 256 MiB cgroup")
	}
	if raceEnabled {
		t.Skip("the race detector's shadow memory fills the cgroup")
	}
	g := newIssueCgroup(t, 256*mib)
	cmd := childtest.Command(t, "undercharge", []string{"GOMEMLIMIT", "AUTOMEMLIMIT", "MEMCTL", "MEMCTL_BUDGETS"}, "GOGC=100")
	g.Wrap(cmd)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	report := map[string]string{}
	var lines []string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		lines = append(lines, line)
		if k, v, ok := strings.Cut(line, "="); ok && !strings.Contains(k, " ") {
			report[k] = v
		}
	}
	werr := cmd.Wait()
	kills, kerr := g.OOMKills()
	require.NoError(t, kerr)
	t.Logf("child: %v; OOM kills %d; output:\n%s\nstderr: %s", werr, kills, strings.Join(lines, "\n"), stderr.String())
	require.NotContains(t, report, "ERROR")
	require.Contains(t, report, "WARN_HEAP_LIVE", "the pool said nothing before the end")
	live := childtest.RequireInt(t, report, "WARN_HEAP_LIVE")
	under := childtest.RequireInt(t, report, "WARN_UNDERCHARGED")
	built := childtest.RequireInt(t, report, "WARN_BUILT")
	t.Logf("WARN at live heap %d MiB (%d MiB of rows built, %d KiB charged) in a %d MiB cgroup; Undercharged %d at the WARN",
		live>>20, built>>20, built/1024*8>>10, g.Limit>>20, under)
	assert.Positive(t, under, "counted by the time of the WARN")
	assert.Less(t, live, g.Limit/2, "the WARN comes before the heap is half way to the limit")
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		assert.Positive(t, kills, "ended by the OOM killer: the budget did not stop the under-charged request")
	}
}

// newIssueCgroup creates a child memory cgroup named after this issue and
// the test process, removed at the end of the test (also on failure); it
// skips when no writable memory cgroup exists.
func newIssueCgroup(t *testing.T, limit int64) *cgrouptest.Child {
	t.Helper()
	parent, err := cgrouptest.WritableParent()
	if err != nil {
		t.Skipf("no writable memory cgroup: %v", err)
	}
	c, err := parent.NewChild(fmt.Sprintf("memctl-i20-%d-%d", os.Getpid(), time.Now().UnixNano()), limit)
	if err != nil {
		t.Skipf("cgroup: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Remove(); err != nil {
			t.Errorf("cgroup: %v", err)
		}
	})
	return c
}
