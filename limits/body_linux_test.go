package limits

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
)

func init() { children["uploads"] = uploadsChild }

// The numbers of issue 34's HTTP check.
const (
	uploadsCgroup  = 512 * mib
	uploadsPool    = 256 * mib
	uploadsBudget  = 64 * mib
	uploadsSize    = 200 * mib
	uploadsSlack   = 32 * mib
	uploadsGoLimit = "460MiB" // 90% of the cgroup, as memctl.Start sets it
)

// uploadsChild serves /upload, whose handler reads its whole body with
// io.ReadAll (on error it writes nothing), and /small, which charges,
// builds and answers 64 KiB, behind a middleware of a 256 MiB pool with
// 64 MiB per request: Pool.Middleware, or the middleware before bodies
// were charged when MEMCTL_TEST_MIDDLEWARE=before. It prints LIVE (the
// live heap after a GC) and ADDR, then serves until it is killed.
func uploadsChild() {
	pool, err := NewPool(PoolConfig{Name: "http", Limit: uploadsPool, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		childtest.Fail("%v", err)
	}
	mw := pool.Middleware
	if os.Getenv("MEMCTL_TEST_MIDDLEWARE") == "before" {
		mw = pool.middlewareBefore
	}
	m, err := mw(HTTPConfig{Limit: uploadsBudget})
	if err != nil {
		childtest.Fail("%v", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/upload", m(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return // the middleware answers a budget error
		}
		fmt.Fprintln(w, len(b))
	})))
	mux.Handle("/small", m(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		const n = 64 << 10
		if err := Grow(r.Context(), n); err != nil {
			WriteError(w, err)
			return
		}
		defer Shrink(r.Context(), n)
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i)
		}
		fmt.Fprintln(w, len(b))
	})))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		childtest.Fail("%v", err)
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	childtest.Say("LIVE", ms.HeapAlloc)
	childtest.Say("ADDR", ln.Addr())
	_ = http.Serve(ln, mux)
}

// uploadsRun is what one arm of TestUploadsInCgroup saw.
type uploadsRun struct {
	answers           []string // per upload: "429 resource_exhausted" or the error
	smallOK, smallBad atomic.Int64
	firstBad          atomic.Value
	live, base, peak  int64 // the child's live heap, the cgroup's usage at the reset and its peak after
	kills             int64
	alive             bool
}

// runUploads starts the uploads child (middleware "now" or "before") in a
// fresh 512 MiB cgroup, resets the cgroup's peak, sends three concurrent
// 200 MiB uploads while a client sends small requests, and reads the peak
// and the OOM kills.
func runUploads(t *testing.T, impl string) *uploadsRun {
	g := cgrouptest.New(t, uploadsCgroup)
	if g.Version != 1 {
		t.Skip("needs cgroup v1's memory.max_usage_in_bytes, reset before the uploads")
	}
	cmd := childtest.Command(t, "uploads", []string{"GOMEMLIMIT", "AUTOMEMLIMIT", "GOGC", "MEMCTL", "MEMCTL_BUDGETS"},
		"GOMEMLIMIT="+uploadsGoLimit, "MEMCTL_TEST_MIDDLEWARE="+impl)
	g.Wrap(cmd)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	report := map[string]string{}
	sc := bufio.NewScanner(out)
	for report["ADDR"] == "" && sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			report[k] = v
		}
	}
	go func() {
		_, _ = io.Copy(io.Discard, out)
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("%s child stderr:\n%s", impl, stderr.String())
		}
	})
	require.NotEmpty(t, report["ADDR"], "child: %s", stderr.String())
	url := "http://" + report["ADDR"]
	res := &uploadsRun{}
	res.live, err = strconv.ParseInt(report["LIVE"], 10, 64)
	require.NoError(t, err)

	// The peak from here on (writing 0 resets it to the usage now).
	require.NoError(t, os.WriteFile(filepath.Join(g.Dir, "memory.max_usage_in_bytes"), []byte("0"), 0))
	res.base = cgroupFile(t, g.Dir, "memory.usage_in_bytes")

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { // small requests, one after another, all along
		client := &http.Client{Timeout: 10 * time.Second}
		for {
			select {
			case <-stop:
				return
			default:
			}
			resp, err := client.Get(url + "/small")
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					res.smallOK.Add(1)
					continue
				}
				err = errors.New(resp.Status)
			}
			if res.smallBad.Add(1) == 1 {
				res.firstBad.Store(err.Error())
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	time.Sleep(100 * time.Millisecond) // small requests before the uploads too

	// One with a Content-Length, one chunked, and a third with a
	// Content-Length: two chunked bodies could each hold their 64 MiB
	// budget at once, twice the bound of one.
	res.answers = make([]string, 3)
	var uploads sync.WaitGroup
	for i, chunked := range []bool{false, true, false} {
		uploads.Go(func() {
			req, err := http.NewRequest(http.MethodPost, url+"/upload", io.NopCloser(&zeros{n: uploadsSize}))
			if err != nil {
				res.answers[i] = err.Error()
				return
			}
			req.ContentLength = uploadsSize
			if chunked {
				req.ContentLength = -1
			}
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			resp, err := (&http.Client{Transport: tr, Timeout: 60 * time.Second}).Do(req)
			if err != nil {
				res.answers[i] = err.Error()
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var eb errorBody
			if resp.StatusCode == http.StatusTooManyRequests && jsonInto(b, &eb) == nil {
				res.answers[i] = fmt.Sprintf("%d %s", resp.StatusCode, eb.Code)
			} else {
				res.answers[i] = fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(b)))
			}
		})
	}
	uploads.Wait()
	time.Sleep(200 * time.Millisecond) // small requests after them too
	close(stop)
	wg.Wait()

	res.peak = cgroupFile(t, g.Dir, "memory.max_usage_in_bytes")
	res.kills, err = g.OOMKills()
	require.NoError(t, err)
	select {
	case <-exited:
	default:
		res.alive = true
	}
	t.Logf("%s: uploads %q; small requests %d ok, %d failed (first: %v); cgroup usage %.1f MiB at the reset, peak %.1f MiB of %d MiB; live heap %.1f MiB; OOM kills %d; alive %v",
		impl, res.answers, res.smallOK.Load(), res.smallBad.Load(), res.firstBad.Load(),
		float64(res.base)/(1<<20), float64(res.peak)/(1<<20), uploadsCgroup>>20, float64(res.live)/(1<<20), res.kills, res.alive)
	return res
}

// TestUploadsInCgroup is issue 34's HTTP check: a server in a 512 MiB v1
// memory cgroup, a 256 MiB pool, 64 MiB per request, a handler that reads
// its whole body with io.ReadAll, and three concurrent 200 MiB uploads
// (Content-Length, chunked, Content-Length) while small requests go on:
// each upload gets 429 resource_exhausted, nothing is OOM-killed, the
// cgroup's peak is at most the live heap + 64 MiB (one request's budget) +
// 32 MiB, and every small request gets 200. The same uploads against the
// middleware before bodies were charged, the control, go past that bound
// (the issue: OOM-killed at 512 MiB).
func TestUploadsInCgroup(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a 512 MiB cgroup")
	}
	if raceEnabled {
		t.Skip("the race detector's shadow memory fills the cgroup")
	}
	now := runUploads(t, "now")
	bound := now.live + uploadsBudget + uploadsSlack
	for i, a := range now.answers {
		assert.Equal(t, "429 resource_exhausted", a, "upload %d", i)
	}
	assert.Zero(t, now.kills, "no OOM kill")
	assert.True(t, now.alive, "the server lives")
	assert.Zero(t, now.smallBad.Load(), "small requests that failed (first: %v)", now.firstBad.Load())
	assert.Positive(t, now.smallOK.Load())
	assert.LessOrEqual(t, now.peak, bound, "peak %.1f MiB, bound %.1f MiB (live heap + 64 MiB + 32 MiB)",
		float64(now.peak)/(1<<20), float64(bound)/(1<<20))

	before := runUploads(t, "before")
	assert.True(t, before.kills > 0 || before.peak > before.live+uploadsBudget+uploadsSlack,
		"the control is OOM-killed or passes the bound: it shows what the check checks")
	t.Logf("peak: %.1f MiB with bodies charged, %.1f MiB before (OOM kills %d, alive %v)",
		float64(now.peak)/(1<<20), float64(before.peak)/(1<<20), before.kills, before.alive)
}

func cgroupFile(t *testing.T, dir, name string) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	require.NoError(t, err)
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	require.NoError(t, err)
	return n
}

func jsonInto(b []byte, v any) error { return json.Unmarshal(b, v) }
