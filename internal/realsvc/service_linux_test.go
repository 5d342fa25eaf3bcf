package realsvc

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memctl/memctl/internal/cgrouptest"
)

// arm is one service process in a cgroup of its own: the plain control or
// a memctl variant.
type arm struct {
	name string // "plain", "auto" or "budget"
	g    *cgrouptest.Group
	cmd  *exec.Cmd
	log  string // its standard output and error
	// done is closed when the process has exited; err is then its exit.
	done chan struct{}
	err  error
}

// newArm makes a cgroup of limit bytes for the arm; the cgroup is removed
// at the end of the test, after the process is stopped.
func newArm(t *testing.T, name string, limit int64) *arm {
	t.Helper()
	return &arm{name: name, g: cgrouptest.New(t, limit), log: filepath.Join(t.TempDir(), name+".log")}
}

// env is this process's environment without the variables that change
// the Go runtime or memctl, so that every arm runs with the defaults.
func env() []string {
	var e []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == "GOMEMLIMIT" || k == "GOGC" || k == "GODEBUG" || k == "AUTOMEMLIMIT" || strings.HasPrefix(k, "MEMCTL") {
			continue
		}
		e = append(e, kv)
	}
	return e
}

// start runs bin with args in the arm's cgroup, in dir. The end of the test
// stops it (SIGTERM, then SIGKILL after 5 s).
func (a *arm) start(t *testing.T, dir, bin string, args ...string) {
	t.Helper()
	f, err := os.Create(a.log)
	if err != nil {
		t.Fatal(err)
	}
	a.cmd = exec.Command(bin, args...)
	a.cmd.Dir, a.cmd.Env, a.cmd.Stdout, a.cmd.Stderr = dir, env(), f, f
	a.g.Wrap(a.cmd)
	if err := a.cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("realsvc: %s: %v", a.name, err)
	}
	a.done = make(chan struct{})
	go func() {
		a.err = a.cmd.Wait()
		f.Close()
		close(a.done)
	}()
	t.Cleanup(a.stop)
}

func (a *arm) pid() int { return a.cmd.Process.Pid }

func (a *arm) stop() {
	if a.alive() {
		_ = a.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-a.done:
		case <-time.After(5 * time.Second):
			_ = a.cmd.Process.Kill()
			<-a.done
		}
	}
}

func (a *arm) alive() bool {
	select {
	case <-a.done:
		return false
	default:
		return true
	}
}

// fate says whether the process still runs and how many OOM kills its
// cgroup counted: "alive, 0 OOM kills" or "exited (signal: killed), 1 OOM
// kill".
func (a *arm) fate(t *testing.T) (ok bool, s string) {
	n, err := a.g.OOMKills()
	if err != nil {
		t.Errorf("realsvc: %s: %v", a.name, err)
	}
	state := "alive"
	if !a.alive() {
		state = fmt.Sprintf("exited (%v)", a.err)
	}
	return a.alive() && n == 0, fmt.Sprintf("%s, %d OOM kill(s)", state, n)
}

// memctlLines returns the lines of the arm's log that memctl wrote (its
// startup line, WARNs and trims), at most n.
func (a *arm) memctlLines(n int) []string {
	f, err := os.Open(a.log)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() && len(out) < n {
		if l := sc.Text(); strings.Contains(l, "memctl") || strings.Contains(l, "limits:") {
			out = append(out, l)
		}
	}
	return out
}

// tail returns the last n lines of the arm's log.
func (a *arm) tail(n int) string {
	b, _ := os.ReadFile(a.log)
	return lastLines(string(b), n)
}

// freePort returns a TCP port on 127.0.0.1 that nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// waitHTTP waits until GET url answers 200, the arm exits, or timeout.
func waitHTTP(a *arm, url string, timeout time.Duration) error {
	c := &http.Client{Timeout: time.Second}
	for end := time.Now().Add(timeout); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if !a.alive() {
			return fmt.Errorf("%s exited: %v", a.name, a.err)
		}
		if r, err := c.Get(url); err == nil {
			r.Body.Close()
			if r.StatusCode == http.StatusOK {
				return nil
			}
		}
	}
	return errors.New(a.name + ": " + url + " not ready after " + timeout.String())
}

// notTmpfs fails when dir is on tmpfs or ramfs, whose pages are shmem
// held outside Go: the etcd database must be on a disk for its mapped
// pages to be page cache.
func notTmpfs(dir string) error {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return err
	}
	const tmpfsMagic, ramfsMagic = 0x01021994, 0x858458f6
	if st.Type == tmpfsMagic || st.Type == ramfsMagic {
		return fmt.Errorf("%s is on tmpfs or ramfs (set REALSVC_CACHE to a directory on disk)", dir)
	}
	return nil
}

// cpuBound is the CPU a memctl arm may use beside its plain control in
// the same run: ratio x the control's, plus the trim budget (2% of one
// CPU over the wall time, README "What it does").
func cpuBound(plain, wall time.Duration) time.Duration {
	return time.Duration(cpuRatio*float64(plain)) + wall/50
}

// cpuRatio is what memctl's CPU may be beside the plain control's before
// the trim budget: the noise between two copies of one service under the
// same load at the same time on a shared 2-core machine (0.8-1.4 between
// Pushgateway arms in runs beside other engineers' busy loops), and the
// GC cycles that a GOMEMLIMIT near the live heap adds while a burst is
// held, which no contract bounds.
const cpuRatio = 1.5

func secs(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }
