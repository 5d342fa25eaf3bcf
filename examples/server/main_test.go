package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/procfs"
	"github.com/memctl/memctl/limits"
)

const (
	mib = int64(1 << 20)
	// runawayN asks for a 1 GiB list.
	runawayN = (1 << 30) / 8
	// smallN asks for 160 KB.
	smallN = 20000
)

type errorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func TestParseFlags(t *testing.T) {
	c, err := parseFlags([]string{"-request-budget", "32MiB", "-pool", "1GiB"})
	require.NoError(t, err)
	assert.Equal(t, int64(32*mib), c.requestBudget)
	assert.Equal(t, int64(1<<30), c.pool.Limit)
	_, err = parseFlags([]string{"-request-budget", "lots"})
	assert.ErrorContains(t, err, "-request-budget")
	assert.ErrorContains(t, err, `"lots"`)
}

func TestSortInProcess(t *testing.T) {
	h, pool, err := newHandler(config{requestBudget: 64 * mib, budgets: true, pool: limits.PoolConfig{Limit: 256 * mib, HeapPressure: -1}})
	require.NoError(t, err)
	defer pool.Close()
	srv := httptest.NewServer(h)
	defer srv.Close()

	code, body := get(t, srv.URL+"/sort?n=100000")
	require.Equal(t, 200, code, body)
	var s summary
	require.NoError(t, json.Unmarshal([]byte(body), &s))
	assert.Equal(t, int64(100000), s.N)
	assert.LessOrEqual(t, s.Min, s.Median)
	assert.LessOrEqual(t, s.Median, s.Max)

	code, body = get(t, fmt.Sprintf("%s/sort?n=%d", srv.URL, runawayN))
	assert.Equal(t, 429, code)
	var eb errorBody
	require.NoError(t, json.Unmarshal([]byte(body), &eb), body)
	assert.Equal(t, "resource_exhausted", eb.Code)
	assert.Contains(t, eb.Message, "resource_exhausted in pool/req-2:")
	assert.Zero(t, pool.Used(), "every request's bytes went back")
	assert.Greater(t, pool.Stats().Peak, 32*mib, "the runaway request got as far as its budget allows")
	assert.LessOrEqual(t, pool.Stats().Peak, 64*mib+64<<10)

	for _, bad := range []string{"", "n=0", "n=-5", "n=x", fmt.Sprintf("n=%d", int64(maxN)+1)} {
		code, _ := get(t, srv.URL+"/sort?"+bad)
		assert.Equal(t, 400, code, bad)
	}
}

// TestSortNoRequestBudget: -request-budget 0 asks for no per-request limit
// (limits.Unlimited): the pool alone refuses, with its own scope, and the
// server reports no leak. The request (32 MiB) is larger than the whole
// pool (16 MiB), so no retry can succeed: no Retry-After.
func TestSortNoRequestBudget(t *testing.T) {
	h, pool, err := newHandler(config{requestBudget: 0, budgets: true, pool: limits.PoolConfig{Limit: 16 * mib, HeapPressure: -1}})
	require.NoError(t, err)
	defer pool.Close()
	srv := httptest.NewServer(h)
	defer srv.Close()
	code, body := get(t, srv.URL+"/sort?n=100000")
	require.Equal(t, 200, code, body)
	resp, err := http.Get(fmt.Sprintf("%s/sort?n=%d", srv.URL, 4*mib))
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, 429, resp.StatusCode)
	assert.Contains(t, string(b), "resource_exhausted in pool:")
	assert.Empty(t, resp.Header.Get("Retry-After"), "larger than the whole pool: a retry cannot succeed")
	st := pool.Stats()
	assert.Zero(t, st.Used)
	assert.Zero(t, st.Leaked)
	assert.Zero(t, st.Misuse)
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// TestRunawayInCgroup runs the server binary in a real memory cgroup limited
// to 256 MiB, with GOMEMLIMIT=192MiB (so the pool is 96 MiB) and a 32 MiB
// budget per request, and sends 1 GiB requests, two at a time, while eight
// clients keep sending small ones. A runaway request holds at most 24 MiB
// (its old and new arrays) before its budget refuses the next doubling, so
// two of them and the small requests fit in the pool. With budgets, every
// runaway request gets 429 resource_exhausted, every small one succeeds and
// the server lives; without, the OOM killer ends it.
func TestRunawayInCgroup(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the server in a cgroup")
	}
	bin := buildServer(t)
	t.Run("budgets", func(t *testing.T) {
		g := cgrouptest.New(t, 256*mib)
		s := startServer(t, g, bin)
		small := startSmallClients(s.url, 8)
		start := time.Now()

		var codes sync.Map
		const runaways = 6
		for round := range runaways / 2 { // two at a time
			var wg sync.WaitGroup
			for i := 2 * round; i < 2*round+2; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					resp, err := http.Get(fmt.Sprintf("%s/sort?n=%d", s.url, runawayN))
					if err != nil {
						codes.Store(i, err.Error())
						return
					}
					defer resp.Body.Close()
					var eb errorBody
					_ = json.NewDecoder(resp.Body).Decode(&eb)
					codes.Store(i, fmt.Sprintf("%d %s: %s", resp.StatusCode, eb.Code, eb.Message))
				}()
			}
			wg.Wait()
		}
		t.Logf("runaways answered after %v", time.Since(start).Round(time.Millisecond))
		ok, failed := small.stop()

		for i := range runaways {
			v, _ := codes.Load(i)
			msg, _ := v.(string)
			t.Logf("runaway %d: %s", i, msg)
			assert.True(t, strings.HasPrefix(msg, "429 resource_exhausted: limits: resource_exhausted in pool"), "runaway %d: %s", i, msg)
		}
		assert.Zero(t, failed, "small requests that failed")
		assert.Greater(t, ok, int64(8), "small requests that succeeded")
		require.True(t, s.alive(), "the server is alive")
		code, body := get(t, s.url+"/sort?n=1000")
		assert.Equal(t, 200, code, body)
		_, stats := get(t, s.url+"/stats")
		kills, err := g.OOMKills()
		require.NoError(t, err)
		assert.Zero(t, kills)
		hwm := s.hwm(t)
		t.Logf("budgets on: %d small requests ok, %d failed; server VmHWM %d MiB, cgroup peak %d MiB of %d MiB; OOM kills %d; stats %s",
			ok, failed, hwm/mib, cgroupPeak(g)/mib, g.Limit/mib, kills, strings.TrimSpace(stats))
		s.terminate(t)
		t.Logf("budgets on: done after %v", time.Since(start).Round(time.Millisecond))
	})

	t.Run("no budgets", func(t *testing.T) {
		g := cgrouptest.New(t, 256*mib)
		s := startServer(t, g, bin, "-budgets=false")
		small := startSmallClients(s.url, 8)
		start := time.Now()
		resp, err := http.Get(fmt.Sprintf("%s/sort?n=%d", s.url, runawayN))
		if err == nil {
			resp.Body.Close()
			t.Errorf("the runaway request got %d; want the server killed", resp.StatusCode)
		}
		var state *os.ProcessState
		select {
		case <-s.exited:
			state = s.cmd.ProcessState
		case <-time.After(20 * time.Second):
			t.Fatal("the server survived 20 s after a 1 GiB request in 256 MiB")
		}
		ok, failed := small.stop()
		kills, kerr := g.OOMKills()
		require.NoError(t, kerr)
		ws, _ := state.Sys().(syscall.WaitStatus)
		t.Logf("budgets off: server ended %v after %v (%v); %d small requests ok, %d failed; cgroup peak %d MiB of %d MiB; OOM kills %d",
			state, time.Since(start).Round(time.Millisecond), err, ok, failed, cgroupPeak(g)/mib, g.Limit/mib, kills)
		assert.Positive(t, kills, "the kernel OOM killer ended the server")
		assert.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "ended by SIGKILL: %v", state)
	})
}

func buildServer(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command to build the server: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "server")
	out, err := exec.Command(goBin, "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

type server struct {
	cmd    *exec.Cmd
	url    string
	exited chan struct{}
	stderr *bytes.Buffer
}

func startServer(t *testing.T, g *cgrouptest.Group, bin string, args ...string) *server {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"-addr", "127.0.0.1:0", "-request-budget", "32MiB"}, args...)...)
	cmd.Env = append(os.Environ(), "GOMEMLIMIT=192MiB", "GOGC=100")
	g.Wrap(cmd)
	s := &server{cmd: cmd, exited: make(chan struct{}), stderr: new(bytes.Buffer)}
	cmd.Stderr = s.stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("server printed nothing; stderr:\n%s", s.stderr)
	}
	line := sc.Text()
	t.Logf("server: %s", line)
	addr, _, _ := strings.Cut(strings.TrimPrefix(line, "listening on "), " ")
	require.True(t, strings.HasPrefix(addr, "http://127.0.0.1:"), line)
	s.url = addr
	go func() {
		_, _ = io.Copy(io.Discard, stdout)
		_ = cmd.Wait()
		close(s.exited)
	}()
	t.Cleanup(func() {
		if s.alive() {
			_ = cmd.Process.Kill()
			<-s.exited
		}
		if t.Failed() {
			t.Logf("server stderr:\n%s", s.stderr)
		}
	})
	return s
}

func (s *server) alive() bool {
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// hwm returns the server's peak RSS (VmHWM) in bytes.
func (s *server) hwm(t *testing.T) int64 {
	f, err := procfs.ReadFile(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid))
	require.NoError(t, err)
	v, err := f.Bytes("VmHWM")
	require.NoError(t, err)
	return v
}

func (s *server) terminate(t *testing.T) {
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-s.exited:
		assert.True(t, s.cmd.ProcessState.Success(), "clean shutdown: %v", s.cmd.ProcessState)
	case <-time.After(10 * time.Second):
		t.Error("server did not shut down on SIGTERM")
	}
}

// cgroupPeak returns the cgroup's peak memory use in bytes
// (memory.max_usage_in_bytes on v1, memory.peak on v2), or -1.
func cgroupPeak(g *cgrouptest.Group) int64 {
	file := "memory.max_usage_in_bytes"
	if g.Version == 2 {
		file = "memory.peak"
	}
	b, err := os.ReadFile(filepath.Join(g.Dir, file))
	if err != nil {
		return -1
	}
	var n int64
	if _, err := fmt.Sscan(string(b), &n); err != nil {
		return -1
	}
	return n
}

// smallClients keep sending small requests until stopped, each at most 400.
type smallClients struct {
	done       chan struct{}
	wg         sync.WaitGroup
	ok, failed atomic.Int64
}

func startSmallClients(url string, n int) *smallClients {
	c := &smallClients{done: make(chan struct{})}
	client := &http.Client{Timeout: 10 * time.Second}
	for range n {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			for range 400 {
				select {
				case <-c.done:
					return
				default:
				}
				resp, err := client.Get(fmt.Sprintf("%s/sort?n=%d", url, smallN))
				if err != nil {
					c.failed.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 200 {
					c.ok.Add(1)
				} else {
					c.failed.Add(1)
				}
			}
		}()
	}
	return c
}

func (c *smallClients) stop() (ok, failed int64) {
	close(c.done)
	c.wg.Wait()
	return c.ok.Load(), c.failed.Load()
}
