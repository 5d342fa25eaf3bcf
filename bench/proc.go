package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/memctl/memctl/internal/cgroupfs"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/memctl/memctl/internal/procfs"
)

// stripEnv are removed from the arms' environment, so that the arms differ
// only in what the harness sets: an operator's GOMEMLIMIT or MEMCTL=off would
// otherwise make every arm the same.
var stripEnv = []string{"GOMEMLIMIT", "AUTOMEMLIMIT", "MEMCTL", childEnv, paramsEnv}

func childEnviron(spec string, p params) ([]string, error) {
	b, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "MEMCTL_") || slices.Contains(stripEnv, k) {
			continue
		}
		env = append(env, kv)
	}
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
	cg     *cgroupfs.Child
	exited chan struct{} // closed when Wait returned
	err    error         // Wait's error, set before exited is closed
}

// startProc starts exe as the child spec ("scenario/arm"), inside cg when
// it is not nil.
func startProc(exe, spec string, p params, cg *cgroupfs.Child) (*proc, error) {
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

// expect waits up to timeout for the child's next line and checks that it
// is word; it returns when the line was read.
func (pr *proc) expect(word string, timeout time.Duration) (time.Time, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case line, ok := <-pr.lines:
		now := time.Now()
		if !ok {
			return now, pr.failure(fmt.Sprintf("exited while the parent waited for %q", word))
		}
		if line != word {
			return now, pr.failure(fmt.Sprintf("said %q, want %q", line, word))
		}
		return now, nil
	case <-t.C:
		return time.Now(), pr.failure(fmt.Sprintf("no %q within %v", word, timeout))
	}
}

// send writes one line to the child.
func (pr *proc) send(word string) error {
	_, err := io.WriteString(pr.stdin, word+"\n")
	return err
}

// finish closes the child's stdin (the end of the window), reads its
// result, waits for it to exit, checks that the OOM killer left it alone
// and removes its cgroup.
func (pr *proc) finish() (childResult, error) {
	var r childResult
	_ = pr.stdin.Close()
	line, err := func() (string, error) {
		t := time.NewTimer(time.Minute)
		defer t.Stop()
		select {
		case line, ok := <-pr.lines:
			if !ok {
				return "", pr.failure("exited without a result")
			}
			return line, nil
		case <-t.C:
			return "", pr.failure("no result within a minute")
		}
	}()
	if err != nil {
		return r, err
	}
	select {
	case <-pr.exited:
	case <-time.After(time.Minute):
		return r, pr.failure("did not exit within a minute of its result")
	}
	if pr.err != nil {
		return r, pr.failure(pr.err.Error())
	}
	if err := pr.release(); err != nil {
		return r, err
	}
	js, ok := strings.CutPrefix(line, "result ")
	if !ok {
		return r, fmt.Errorf("bench: %s: said %q, want its result", pr.spec, line)
	}
	if err := json.Unmarshal([]byte(js), &r); err != nil {
		return r, fmt.Errorf("bench: %s: result %q: %w", pr.spec, js, err)
	}
	return r, nil
}

// failure stops the child and returns an error naming it with what it
// wrote to stderr and whether the OOM killer killed it.
func (pr *proc) failure(what string) error {
	oom := ""
	if pr.cg != nil {
		if n, err := pr.cg.OOMKills(); err == nil && n > 0 {
			oom = fmt.Sprintf(" (the OOM killer killed %d process(es) in its cgroup)", n)
		}
	}
	if rerr := pr.abort(); rerr != nil {
		return errors.Join(fmt.Errorf("bench: %s: %s%s", pr.spec, what, oom), rerr)
	}
	// The child has exited: its stderr is complete.
	return fmt.Errorf("bench: %s: %s%s\n%s", pr.spec, what, oom, strings.TrimSpace(pr.stderr.String()))
}

// abort kills the child if it is still running, waits for it and removes
// its cgroup. It may be called more than once.
func (pr *proc) abort() error {
	_ = pr.cmd.Process.Kill()
	select {
	case <-pr.exited:
	case <-time.After(10 * time.Second):
		return fmt.Errorf("bench: %s: did not exit within 10 s of SIGKILL", pr.spec)
	}
	return pr.release()
}

// release removes the child's cgroup after checking its OOM kill count.
func (pr *proc) release() error {
	if pr.cg == nil {
		return nil
	}
	cg := pr.cg
	pr.cg = nil
	var err error
	if n, oerr := cg.OOMKills(); oerr == nil && n > 0 {
		err = fmt.Errorf("bench: %s: the OOM killer killed %d process(es) in its cgroup", pr.spec, n)
	}
	return errors.Join(err, cg.Remove())
}

// resetPeak resets the process's peak RSS (VmHWM) to its current RSS by
// writing 5 to /proc/PID/clear_refs (proc(5), Linux 4.0 and later).
func resetPeak(pid int) error {
	path := procfs.Path(pid, "clear_refs")
	if err := os.WriteFile(path, []byte("5"), 0); err != nil {
		return fmt.Errorf("bench: reset peak RSS: %w", err)
	}
	return nil
}

// sampleRSS reads the VmRSS of pid every step after t0 until window has
// passed or stop is closed, and returns the readings with their time after
// t0 in seconds. A reading that fails (the process exited) is an error.
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
