// Package cpuquota makes cgroup v1 cpu children with a CFS bandwidth quota
// (Documentation/scheduler/sched-bwc.rst) and a busy loop that shares it: a
// CPU-throttled container for tests and the harness. It needs root and the
// v1 cpu controller at Root.
package cpuquota

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Root is the cgroup v1 cpu controller's mount point.
const Root = "/sys/fs/cgroup/cpu"

// Group is a cgroup v1 cpu child with a CFS quota, and the busy loop that
// may share it. Its methods are not safe for concurrent use.
type Group struct {
	// Dir is the cgroup's directory.
	Dir  string
	busy *exec.Cmd
}

// SkipUnlessAvailable skips the test unless it runs as root with the
// cgroup v1 cpu controller at Root, saying which is missing.
func SkipUnlessAvailable(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a cgroup v1 cpu child")
	}
	if _, err := os.Stat(filepath.Join(Root, "cpu.cfs_quota_us")); err != nil {
		t.Skipf("needs the cgroup v1 cpu controller: %v", err)
	}
}

// New makes the cpu child name with quota and period in microseconds; the
// error says why when the v1 cpu controller is missing or not writable.
func New(name string, quota, period int) (*Group, error) {
	if _, err := os.Stat(filepath.Join(Root, "cpu.cfs_quota_us")); err != nil {
		return nil, fmt.Errorf("cpuquota: needs the cgroup v1 cpu controller at %s: %w", Root, err)
	}
	g := &Group{Dir: filepath.Join(Root, name)}
	if err := os.Mkdir(g.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("cpuquota: %w", err)
	}
	for _, kv := range [][2]string{{"cpu.cfs_period_us", strconv.Itoa(period)}, {"cpu.cfs_quota_us", strconv.Itoa(quota)}} {
		if err := os.WriteFile(filepath.Join(g.Dir, kv[0]), []byte(kv[1]), 0); err != nil {
			return nil, errors.Join(fmt.Errorf("cpuquota: %w", err), g.Remove())
		}
	}
	return g, nil
}

// Add moves the process pid (all its threads) into the cgroup.
func (g *Group) Add(pid int) error {
	if err := os.WriteFile(filepath.Join(g.Dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		return fmt.Errorf("cpuquota: move %d into %s: %w", pid, g.Dir, err)
	}
	return nil
}

// StartBusy starts the busy loop and moves it into the cgroup.
func (g *Group) StartBusy() error {
	g.busy = exec.Command("sh", "-c", "while :; do :; done")
	if err := g.busy.Start(); err != nil {
		g.busy = nil
		return fmt.Errorf("cpuquota: busy loop: %w", err)
	}
	return g.Add(g.busy.Process.Pid)
}

// BusyPid returns the PID of the busy loop, 0 before StartBusy.
func (g *Group) BusyPid() int {
	if g.busy == nil {
		return 0
	}
	return g.busy.Process.Pid
}

// Remove kills the busy loop, moves what is left to the root cgroup and
// removes the cgroup.
func (g *Group) Remove() error {
	var errs []error
	if g.busy != nil {
		_ = g.busy.Process.Kill()
		_ = g.busy.Wait()
		g.busy = nil
	}
	if b, err := os.ReadFile(filepath.Join(g.Dir, "cgroup.procs")); err == nil {
		for _, pid := range strings.Fields(string(b)) {
			if err := os.WriteFile(filepath.Join(Root, "cgroup.procs"), []byte(pid), 0); err != nil {
				errs = append(errs, fmt.Errorf("cpuquota: move %s out of %s: %w", pid, g.Dir, err))
			}
		}
	}
	var err error
	// A process just moved out may still be counted for a moment, longer
	// on a loaded machine.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if err = os.Remove(g.Dir); err == nil || os.IsNotExist(err) {
			return errors.Join(errs...)
		}
		if time.Now().After(deadline) {
			break
		}
	}
	return errors.Join(append(errs, fmt.Errorf("cpuquota: remove %s: %w", g.Dir, err))...)
}
