package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/cpuquota"
	"github.com/memctl/memctl/internal/procfs"
	"io"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// stripEnv (and MEMCTL_*) are removed from the arms' environment, so that
// the arms differ only in what the harness sets.
var stripEnv = []string{"GOMEMLIMIT", "AUTOMEMLIMIT", "MEMCTL", childEnv, paramsEnv}

func childEnviron(spec string, p params) ([]string, error) {
	b, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return strings.HasPrefix(k, "MEMCTL_") || slices.Contains(stripEnv, k)
	})
	return append(env, childEnv+"="+spec, paramsEnv+"="+string(b)), nil
}

// proc is one running arm, seen from the parent.
type proc struct {
	spec   string
	cmd    *exec.Cmd
	pid    int
	stdin  io.WriteCloser
	lines  chan string
	stderr bytes.Buffer
	exited chan struct{} // closed when Wait returned
	err    error         // Wait's error, set before exited is closed

	// fail is the first error of the parent's side (the methods from next
	// to sampleInBackground): after it they do nothing and return zero
	// values, as bufio.Writer does, so that an observe reads as its steps.
	fail     error
	finished bool
	result   childResult // finish's

	mu      sync.Mutex        // guards the rest: abortRunning runs on another goroutine
	cg      *cgrouptest.Child // nil once removed
	quota   *cpuquota.Group   // the CPU-quota cgroup it was moved into; nil once removed
	aborted bool              // abort was called: enterQuota makes no cgroup
}

// running are the arms started and not yet done with, for abortRunning.
var running = struct {
	sync.Mutex
	procs   map[*proc]bool
	stopped bool
}{procs: make(map[*proc]bool)}

// untrack forgets a finished arm.
func (pr *proc) untrack() {
	running.Lock()
	delete(running.procs, pr)
	running.Unlock()
}

// abortRunning aborts every running arm and stops startArm from starting
// more.
func abortRunning() error {
	running.Lock()
	running.stopped = true
	procs := slices.Collect(maps.Keys(running.procs))
	running.Unlock()
	var errs []error
	for _, pr := range procs {
		errs = append(errs, pr.abort())
	}
	return errors.Join(errs...)
}

// enterQuota makes the CPU-quota cgroup name (quota and period in µs),
// moves the child into it and starts the busy loop beside it; leaveQuota
// or abort removes it, failing or not.
func (pr *proc) enterQuota(name string, quota, period int) error {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.aborted {
		return fmt.Errorf("bench: %s: aborted", pr.spec)
	}
	g, err := cpuquota.New(name, quota, period)
	if err != nil {
		return err
	}
	pr.quota = g
	if err := g.Add(pr.pid); err != nil {
		return err
	}
	return g.StartBusy()
}

// startProc starts exe as the child spec, inside cg when not nil.
func startProc(exe, spec string, p params, cg *cgrouptest.Child) (*proc, error) {
	env, err := childEnviron(spec, p)
	if err != nil {
		return nil, err
	}
	pr := &proc{spec: spec, cg: cg, lines: make(chan string, 16), exited: make(chan struct{})}
	pr.cmd = exec.Command(exe)
	pr.cmd.Env = env
	pr.cmd.Stderr = &pr.stderr
	if cg != nil {
		cg.Wrap(pr.cmd)
	}
	if pr.stdin, err = pr.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := pr.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := pr.cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: start %s: %w", spec, err)
	}
	pr.pid = pr.cmd.Process.Pid
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 4096), 1<<20)
		for sc.Scan() {
			pr.lines <- sc.Text()
		}
		close(pr.lines)
		pr.err = pr.cmd.Wait()
		close(pr.exited)
	}()
	return pr, nil
}

// next waits up to timeout for the child's next line; what names the line
// in errors.
func (pr *proc) next(timeout time.Duration, what string) string {
	if pr.fail != nil {
		return ""
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case line, ok := <-pr.lines:
		if ok {
			return line
		}
		pr.fail = pr.failure("exited while the parent waited for " + what)
	case <-t.C:
		pr.fail = pr.failure(fmt.Sprintf("no %s within %v", what, timeout))
	}
	return ""
}

// expect waits up to timeout for the child's next line, word, and returns
// when it was read.
func (pr *proc) expect(word string, timeout time.Duration) time.Time {
	line := pr.next(timeout, strconv.Quote(word))
	if pr.fail == nil && line != word {
		pr.fail = pr.failure(fmt.Sprintf("said %q, want %q", line, word))
	}
	return time.Now()
}

// send writes one line to the child.
func (pr *proc) send(word string) {
	if pr.fail == nil {
		_, pr.fail = io.WriteString(pr.stdin, word+"\n")
	}
}

// check records err as the failure if it is the first, and reports whether
// there is none.
func (pr *proc) check(err error) bool {
	if pr.fail == nil {
		pr.fail = err
	}
	return pr.fail == nil
}

// status returns the "N kB" field key of the child's /proc/PID/status, in
// bytes.
func (pr *proc) status(key string) int64 {
	if pr.fail != nil {
		return 0
	}
	n, err := procfs.ReadBytes(procfs.StatusPath(pr.pid), key)
	pr.check(err)
	return n
}

// resetPeak resets the child's peak RSS (VmHWM) to its current RSS by
// writing 5 to /proc/PID/clear_refs (proc(5), Linux 4.0 and later).
func (pr *proc) resetPeak() {
	if pr.fail == nil {
		if err := os.WriteFile(procfs.Path(pr.pid, "clear_refs"), []byte("5"), 0); err != nil {
			pr.fail = fmt.Errorf("bench: reset peak RSS: %w", err)
		}
	}
}

// finish takes the child out of its CPU quota, ends the window, reads the
// child's result, waits for it to exit and releases its cgroup; a second
// call returns the same result.
func (pr *proc) finish() childResult {
	if pr.finished || !pr.check(pr.leaveQuota()) {
		return pr.result
	}
	pr.finished = true
	_ = pr.stdin.Close()
	line := pr.next(time.Minute, "its result")
	if pr.fail != nil {
		return pr.result
	}
	select {
	case <-pr.exited:
	case <-time.After(time.Minute):
		pr.fail = pr.failure("did not exit within a minute of its result")
		return pr.result
	}
	if pr.err != nil {
		pr.fail = pr.failure(pr.err.Error())
		return pr.result
	}
	if !pr.check(pr.release()) {
		return pr.result
	}
	js, ok := strings.CutPrefix(line, "result ")
	if !ok {
		pr.fail = fmt.Errorf("bench: %s: said %q, want its result", pr.spec, line)
	} else if err := json.Unmarshal([]byte(js), &pr.result); err != nil {
		pr.fail = fmt.Errorf("bench: %s: result %q: %w", pr.spec, js, err)
	}
	return pr.result
}

// failure stops the child and returns an error with its stderr.
func (pr *proc) failure(what string) error {
	oom := ""
	pr.mu.Lock()
	cg := pr.cg
	pr.mu.Unlock()
	if cg != nil {
		if n, err := cg.OOMKills(); err == nil && n > 0 {
			oom = fmt.Sprintf(" (the OOM killer killed %d process(es) in its cgroup)", n)
		}
	}
	if rerr := pr.abort(); rerr != nil {
		return errors.Join(fmt.Errorf("bench: %s: %s%s", pr.spec, what, oom), rerr)
	}
	return fmt.Errorf("bench: %s: %s%s\n%s", pr.spec, what, oom, strings.TrimSpace(pr.stderr.String()))
}

// exitTimeout bounds the wait for a killed child to exit.
const exitTimeout = time.Minute

// abort takes the child out of its CPU quota first (a throttled process
// exits slowly), kills it, waits for it and removes its cgroups even when
// it did not exit in time. Each call retries what is left.
func (pr *proc) abort() error {
	pr.mu.Lock()
	pr.aborted = true
	pr.mu.Unlock()
	qerr := pr.leaveQuota()
	_ = pr.cmd.Process.Kill()
	var werr error
	select {
	case <-pr.exited:
	case <-time.After(exitTimeout):
		werr = fmt.Errorf("bench: %s: did not exit within %v of SIGKILL", pr.spec, exitTimeout)
	}
	return errors.Join(qerr, werr, pr.release())
}

// leaveQuota removes the child's CPU-quota cgroup, if any, with its busy
// loop; it may be called more than once.
func (pr *proc) leaveQuota() error {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.quota != nil {
		if err := pr.quota.Remove(); err != nil {
			return err
		}
		pr.quota = nil
	}
	return nil
}

// release removes the child's cgroup after checking its OOM kill count;
// until removed it is kept, so that a later call retries.
func (pr *proc) release() error {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.cg == nil {
		return nil
	}
	var err error
	if n, oerr := pr.cg.OOMKills(); oerr == nil && n > 0 {
		err = fmt.Errorf("bench: %s: the OOM killer killed %d process(es) in its cgroup", pr.spec, n)
	}
	if rerr := pr.cg.Remove(); rerr != nil {
		return errors.Join(err, rerr)
	}
	pr.cg = nil
	return err
}

// sampleRSS reads pid's VmRSS every step after t0 until window has passed
// or stop is closed; a failed read (the process exited) is an error.
func sampleRSS(pid int, t0 time.Time, step, window time.Duration, stop <-chan struct{}) ([]sample, error) {
	samples := make([]sample, 0, int(window/step)+1)
	for k := 1; ; k++ {
		at := time.Duration(k) * step
		if at > window {
			return samples, nil
		}
		wait := time.NewTimer(time.Until(t0.Add(at)))
		select {
		case <-stop:
			wait.Stop()
			return samples, nil
		case <-wait.C:
		}
		rss, err := procfs.RSS(pid)
		if err != nil {
			return samples, fmt.Errorf("bench: sample RSS: %w", err)
		}
		samples = append(samples, sample{at: time.Since(t0).Seconds(), rss: rss})
	}
}

// sample runs sampleRSS on the child.
func (pr *proc) sample(t0 time.Time, step, window time.Duration) []sample {
	if pr.fail != nil {
		return nil
	}
	samples, err := sampleRSS(pr.pid, t0, step, window, nil)
	pr.check(err)
	return samples
}

// sampleInBackground runs sampleRSS on the child on a goroutine of its own
// until stop.
func (pr *proc) sampleInBackground(t0 time.Time, step, window time.Duration) (stop func() []sample) {
	if pr.fail != nil {
		return func() []sample { return nil }
	}
	quit, done := make(chan struct{}), make(chan struct{})
	var samples []sample
	var err error
	go func() {
		defer close(done)
		samples, err = sampleRSS(pr.pid, t0, step, window, quit)
	}()
	return func() []sample {
		close(quit)
		<-done
		pr.check(err)
		return samples
	}
}
