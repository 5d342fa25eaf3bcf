package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/memctl/memctl/grpcbudget"
	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/internal/procfs"
	"github.com/memctl/memctl/limits"
)

// The numbers of issue 34's gRPC check.
const (
	peakPool   = 256 * mib
	peakBudget = 64 * mib
	peakSize   = 48 * mib
	peakCalls  = 8
)

func TestMain(m *testing.M) {
	childtest.Main(m, map[string]func(){"server": serverChild})
}

// serverChild is the example server (NewServer, with Options, or
// InterceptorOptions when MEMCTL_TEST_MESSAGES=off, and the maximum
// receive size at the per-call budget) with a 256 MiB pool and 64 MiB per
// call, in a process of its own. It prints ADDR, then HOLDING=n each time
// the number of Upload handlers running changes (an interceptor inside
// the budget's counts them); on SIGUSR1 it runs two GC cycles and prints
// HELD_LIVE, the live heap then; on SIGTERM it prints LIVE_PEAK, the
// highest live heap a GC cycle found (runtime/metrics /gc/heap/live:bytes,
// read every 2 ms), and exits.
func serverChild() {
	var peak atomic.Uint64
	go func() {
		s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		for range time.Tick(2 * time.Millisecond) {
			metrics.Read(s)
			if v := s[0].Value.Uint64(); v > peak.Load() {
				peak.Store(v)
			}
		}
	}()
	pool, err := limits.NewPool(limits.PoolConfig{Name: "grpc", Limit: peakPool, CancelLargest: true})
	if err != nil {
		childtest.Fail("%v", err)
	}
	options := Options
	if os.Getenv("MEMCTL_TEST_MESSAGES") == "off" {
		options = InterceptorOptions
	}
	opts, err := options(pool, grpcbudget.Config{Limit: peakBudget})
	if err != nil {
		childtest.Fail("%v", err)
	}
	var mu sync.Mutex
	var holding int
	count := func(d int) {
		mu.Lock()
		holding += d
		childtest.Say("HOLDING", holding)
		mu.Unlock()
	}
	counter := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		count(1)
		defer count(-1)
		return handler(ctx, req)
	}
	srv := NewServer(append(opts, grpc.ChainUnaryInterceptor(counter), grpc.MaxRecvMsgSize(int(peakBudget)))...)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		childtest.Fail("%v", err)
	}
	go func() { _ = srv.Serve(ln) }()
	childtest.Say("ADDR", ln.Addr())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1, syscall.SIGTERM)
	for s := range sig {
		if s == syscall.SIGTERM {
			break
		}
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		mu.Lock()
		childtest.Say("HELD_LIVE", ms.HeapAlloc)
		mu.Unlock()
	}
	srv.Stop()
	childtest.Say("LIVE_PEAK", peak.Load())
}

// peakChild is one server child and what its eight calls saw.
type peakChild struct {
	cmd         *exec.Cmd
	stderr      *strings.Builder
	addr        string
	lines       chan string // the child's report lines after ADDR
	base, hwm   int64       // VmRSS before the calls, VmHWM after
	held, peak  int64       // HELD_LIVE, LIVE_PEAK
	ok, refused atomic.Int64
	other       []string
	mu          sync.Mutex
}

func startPeakChild(t *testing.T, messages string) *peakChild {
	t.Helper()
	c := &peakChild{stderr: new(strings.Builder), lines: make(chan string, 1000)}
	c.cmd = childtest.Command(t, "server", []string{"GOMEMLIMIT", "AUTOMEMLIMIT", "GOGC", "MEMCTL", "MEMCTL_BUDGETS"},
		"MEMCTL_TEST_MESSAGES="+messages, "GOGC=10")
	out, err := c.cmd.StdoutPipe()
	require.NoError(t, err)
	c.cmd.Stderr = c.stderr
	require.NoError(t, c.cmd.Start())
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
		if t.Failed() {
			t.Logf("server (messages %s) stderr:\n%s", messages, c.stderr)
		}
	})
	sc := bufio.NewScanner(out)
	for c.addr == "" && sc.Scan() {
		c.addr, _ = strings.CutPrefix(sc.Text(), "ADDR=")
	}
	require.NotEmpty(t, c.addr, "stderr: %s", c.stderr)
	go func() {
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	c.base = procStatus(t, c.cmd.Process.Pid, "VmRSS")
	return c
}

// call makes one 48 MiB Upload call on a connection of its own, asking the
// handler to hold the message until ctx ends.
func (c *peakChild) call(ctx context.Context) {
	conn, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err == nil {
		defer conn.Close()
		_, _, err = upload(ctx, conn, peakSize, time.Hour)
	}
	switch {
	case err == nil || ctx.Err() != nil:
		c.ok.Add(1)
	case status.Code(err) == codes.ResourceExhausted:
		c.refused.Add(1)
	default:
		c.mu.Lock()
		c.other = append(c.other, err.Error())
		c.mu.Unlock()
	}
}

// await reads report lines until one is key=want, or key is present when
// want is "", and returns its value.
func (c *peakChild) await(t *testing.T, key, want string, timeout time.Duration) string {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case line, ok := <-c.lines:
			require.True(t, ok, "the server ended; stderr: %s", c.stderr)
			if k, v, _ := strings.Cut(line, "="); k == key && (want == "" || v == want) {
				return v
			}
		case <-deadline:
			t.Fatalf("no %s=%s after %v", key, want, timeout)
		}
	}
}

// TestEightUploadsPeak is issue 34's gRPC check on the example server, in
// processes of its own: eight concurrent 48 MiB Upload calls, a 64 MiB
// per-call budget (and maximum receive size), a 256 MiB pool, against a
// server that charges each message before it is unmarshaled and, the
// control, one with the interceptors alone, both at once (the same client,
// the same machine). Once every call is held by its handler or refused,
// each server's live heap after a GC (HELD_LIVE) is what the messages it
// unmarshaled hold: the charge keeps it within the pool (five messages),
// the control holds all eight. The highest live heap (LIVE_PEAK) and peak
// RSS (VmHWM) are logged beside it: they include the wire bytes of all
// eight, read before any budget sees them in both. The servers run with
// GOGC=10, so that the peaks follow what is live rather than when the
// collector ran.
func TestEightUploadsPeak(t *testing.T) {
	if testing.Short() {
		t.Skip("sends 2 x 384 MiB to child servers")
	}
	if raceEnabled {
		t.Skip("the race detector's shadow memory hides the peak")
	}
	with, without := startPeakChild(t, "on"), startPeakChild(t, "off")
	ctx, release := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range peakCalls {
		wg.Go(func() { with.call(ctx) })
		wg.Go(func() { without.call(ctx) })
	}
	admitted := int(peakPool / peakSize) // five
	with.await(t, "HOLDING", strconv.Itoa(admitted), time.Minute)
	without.await(t, "HOLDING", strconv.Itoa(peakCalls), time.Minute)
	require.Eventually(t, func() bool { return with.refused.Load() == int64(peakCalls-admitted) }, time.Minute, 10*time.Millisecond,
		"the calls past the pool's room are refused: %v", with.other)
	for _, c := range []*peakChild{with, without} {
		require.NoError(t, c.cmd.Process.Signal(syscall.SIGUSR1))
		c.held, _ = strconv.ParseInt(c.await(t, "HELD_LIVE", "", time.Minute), 10, 64)
	}
	release()
	wg.Wait()
	for _, c := range []*peakChild{with, without} {
		c.hwm = procStatus(t, c.cmd.Process.Pid, "VmHWM")
		require.NoError(t, c.cmd.Process.Signal(syscall.SIGTERM))
		c.peak, _ = strconv.ParseInt(c.await(t, "LIVE_PEAK", "", time.Minute), 10, 64)
	}
	t.Logf("charged before unmarshal: %d held, %d refused, live heap while held %d MiB, live heap peak %d MiB, VmHWM %d MiB (VmRSS %d MiB before)",
		with.ok.Load(), with.refused.Load(), with.held>>20, with.peak>>20, with.hwm>>20, with.base>>20)
	t.Logf("the interceptors alone: %d held, %d refused, live heap while held %d MiB, live heap peak %d MiB, VmHWM %d MiB (VmRSS %d MiB before)",
		without.ok.Load(), without.refused.Load(), without.held>>20, without.peak>>20, without.hwm>>20, without.base>>20)
	assert.Empty(t, with.other)
	assert.Empty(t, without.other)
	assert.LessOrEqual(t, with.held, peakPool+32*mib, "what is unmarshaled stays within the pool")
	assert.Greater(t, without.held, peakPool, "the control holds more than the pool: all eight")
}

func procStatus(t *testing.T, pid int, field string) int64 {
	t.Helper()
	f, err := procfs.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	v, err := f.Bytes(field)
	require.NoError(t, err)
	return v
}
