package memctl

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/internal/plot"
	"github.com/memctl/memctl/limits"
)

func init() { moreChildren["page"] = childPage }

const pageBurst = 256 << 20

// childPage serves Handler on 127.0.0.1 (ADDR=host:port on stdout) with a
// pool whose name is hostile, and on "burst" on standard input makes a
// 256 MiB burst, drops it, marks it (AfterBurst) and says BURST_DONE=1.
func childPage() {
	ctl, err := Start(WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		childtest.Fail("start: %v", err)
	}
	defer ctl.Close()
	pool, err := limits.NewPool(limits.PoolConfig{Name: hostile, Limit: 8 << 20, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		childtest.Fail("pool: %v", err)
	}
	defer pool.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		childtest.Fail("listen: %v", err)
	}
	go func() { _ = http.Serve(ln, Handler()) }()
	childtest.Say("ADDR", ln.Addr().String())
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if sc.Text() != "burst" {
			continue
		}
		b := make([][]byte, pageBurst>>20)
		for i := range b {
			b[i] = make([]byte, 1<<20)
			for j := 0; j < len(b[i]); j += 4096 {
				b[i][j] = 1
			}
		}
		runtime.GC() // a GC end that sees the burst live
		runtime.KeepAlive(b)
		b = nil
		runtime.GC() // and one that sees it collected
		AfterBurst()
		childtest.Say("BURST_DONE", 1)
	}
}

// TestPageInBrowser (issue 35): a service with memctl makes a burst; its
// /debug/memctl page, loaded in headless Chromium, shows the burst and the
// fall in the RSS series as the browser rendered it, and the pool's hostile
// name as text. The screenshot is kept as a test artifact
// (MEMCTL_TEST_ARTIFACTS, else the test's temporary directory, logged).
func TestPageInBrowser(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's shadow memory is never returned: the RSS series cannot show the fall")
	}
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("needs Debian's chromium (apt-get install chromium): not found")
	}
	cmd := childtest.Command(t, "page", []string{"MEMCTL", "MEMCTL_TRIM_DELAY", "GOMEMLIMIT"})
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(out)
	await := func(key string) string {
		t.Helper()
		for lines.Scan() {
			if v, ok := strings.CutPrefix(lines.Text(), key+"="); ok {
				return v
			}
		}
		t.Fatalf("the child never said %s", key)
		return ""
	}
	url := "http://" + await("ADDR") + "/?format=html"
	_, err = io.WriteString(stdin, "burst\n")
	require.NoError(t, err)
	await("BURST_DONE")
	// The trim comes 2 s after AfterBurst, at the latest its max wait: wait
	// for the page to show it.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		resp, err := http.Get(url)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), `data-label="trim"`) {
			break
		}
		require.True(t, time.Now().Before(deadline), "no trim on the page in 30 s")
	}
	dir := os.Getenv("MEMCTL_TEST_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	shot := filepath.Join(dir, "debug-memctl-page.png")
	dom := runChromium(t, chromium, "--dump-dom", url)
	runChromium(t, chromium, "--screenshot="+shot, "--window-size=1000,1800", url)
	t.Logf("screenshot: %s", shot)
	_, err = os.Stat(shot)
	assert.NoError(t, err, "the screenshot")

	// The rendered DOM: the RSS series as the browser has it.
	m := regexp.MustCompile(`<g class="series" data-name="RSS" data-points="([^"]*)"`).FindStringSubmatch(dom)
	require.NotNil(t, m, "an RSS series in the rendered page:\n%s", dom)
	var rss []plot.Point
	for _, p := range strings.Fields(m[1]) {
		x, y, _ := strings.Cut(p, ",")
		fx, _ := strconv.ParseFloat(x, 64)
		fy, _ := strconv.ParseFloat(y, 64)
		rss = append(rss, plot.Point{X: fx, Y: fy})
	}
	require.NotEmpty(t, rss)
	first, last, peak := rss[0].Y, rss[len(rss)-1].Y, 0.0
	for _, p := range rss {
		peak = max(peak, p.Y)
	}
	t.Logf("RSS on the page: first %.1f MiB, peak %.1f MiB, last %.1f MiB (%d points)", first, peak, last, len(rss))
	assert.GreaterOrEqual(t, peak, first+0.75*float64(pageBurst>>20), "the burst shows")
	assert.LessOrEqual(t, last, first+0.25*(peak-first), "the fall after the trim shows")
	assert.NotContains(t, dom, "<script", "no script ran or was injected")
	assert.Contains(t, dom, "&lt;script&gt;alert(1)&lt;/script&gt;", "the hostile pool name as text")
}

// runChromium runs headless Chromium with the flags this machine needs (no
// sandbox as root, no network of its own) and returns its standard output.
func runChromium(t *testing.T, chromium string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	flags := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + t.TempDir()}
	cmd := exec.CommandContext(ctx, chromium, append(flags, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	require.NoError(t, err, "chromium %v: %s", args, fmt.Sprint(stderr.String()))
	return string(b)
}
