// Package cgrouptest creates a real child memory cgroup (v1, or v2 where the
// memory controller is delegated) under the test process's own cgroup, runs
// commands inside it, and removes it when the test ends. Tests skip, with
// the reason, when the process is not root or no writable memory cgroup
// exists.
//
// For cgroup v2, NewV2 makes a fresh cgroup laid out as containers use it
// (Layouts) and V2.Wrap starts a command in it; RequireV2 skips where no
// writable v2 memory controller exists.
package cgrouptest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memctl/memctl/internal/cgroupfs"
)

// Group is the child memory cgroup New makes.
type Group = Child

// New creates a child memory cgroup with limit bytes, removed at the end of
// the test; it skips t, with the reason, where that is not possible.
func New(t testing.TB, limit int64) *Group {
	t.Helper()
	parent, err := WritableParent()
	if err != nil {
		t.Skipf("cgrouptest: no writable memory cgroup: %v", err)
	}
	c, err := parent.NewChild(fmt.Sprintf("memctl-test-%d-%d", os.Getpid(), time.Now().UnixNano()), limit)
	if err != nil {
		t.Skipf("cgrouptest: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Remove(); err != nil {
			t.Errorf("cgrouptest: %v", err)
		}
	})
	return c
}

// Parent is a memory cgroup under which this process can make child cgroups
// with a memory limit: its own, found by cgroupfs.Of(0).
type Parent struct {
	// Dir is the cgroup's directory, Version 1 or 2.
	Dir     string
	Version int
}

// WritableParent returns this process's own memory cgroup when a child with
// a memory limit can be made in it (root, and in v2 the memory controller
// enabled for children, which the "no internal processes" rule can forbid).
// The error says why not.
func WritableParent() (*Parent, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("cgrouptest: making a memory cgroup needs root")
	}
	l, err := cgroupfs.Of(0)
	if err != nil {
		return nil, err
	}
	if l.Version == 2 {
		ctl := filepath.Join(l.Dir, "cgroup.subtree_control")
		b, err := os.ReadFile(ctl)
		if err != nil {
			return nil, fmt.Errorf("cgrouptest: %w", err)
		}
		if !slices.Contains(strings.Fields(string(b)), "memory") {
			if err := os.WriteFile(ctl, []byte("+memory"), 0); err != nil {
				return nil, fmt.Errorf("cgrouptest: memory controller not delegated: %s: %w", ctl, err)
			}
		}
	}
	return &Parent{Dir: l.Dir, Version: l.Version}, nil
}

// Child is a child memory cgroup with a limit, made by Parent.NewChild.
type Child struct {
	// Dir is the cgroup's directory, Version 1 or 2.
	Dir     string
	Version int
	// Limit is the memory limit in bytes written to memory.limit_in_bytes
	// (v1) or memory.max (v2).
	Limit int64
}

// NewChild makes the child cgroup name with a memory limit of limit bytes
// and no swap beyond it where the kernel accounts swap
// (memory.memsw.limit_in_bytes in v1, memory.swap.max 0 in v2). On error
// nothing is left behind.
func (p *Parent) NewChild(name string, limit int64) (*Child, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("cgrouptest: child cgroup limit %d: want a positive byte count", limit)
	}
	dir := filepath.Join(p.Dir, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cgrouptest: %w", err)
	}
	c := &Child{Dir: dir, Version: p.Version, Limit: limit}
	file, swap, swapVal := "memory.limit_in_bytes", "memory.memsw.limit_in_bytes", strconv.FormatInt(limit, 10)
	if p.Version == 2 {
		file, swap, swapVal = "memory.max", "memory.swap.max", "0"
	}
	if err := os.WriteFile(filepath.Join(dir, file), []byte(strconv.FormatInt(limit, 10)), 0); err != nil {
		_ = c.Remove()
		return nil, fmt.Errorf("cgrouptest: set limit: %w", err)
	}
	// Absent without swap accounting: the limit is then memory only.
	_ = os.WriteFile(filepath.Join(dir, swap), []byte(swapVal), 0)
	return c, nil
}

// Wrap changes cmd so that /bin/sh moves itself into the cgroup and then
// execs cmd's program under the same PID. Call it before cmd.Start.
func (c *Child) Wrap(cmd *exec.Cmd) {
	procs := filepath.Join(c.Dir, "cgroup.procs")
	cmd.Args = append([]string{"/bin/sh", "-c", `echo $$ > "$0" && exec "$@"`, procs, cmd.Path}, cmd.Args[1:]...)
	cmd.Path = "/bin/sh"
}

// OOMKills returns how many processes of the cgroup the OOM killer killed:
// the oom_kill line of memory.oom_control (v1, Linux 4.13 and later) or
// memory.events (v2).
func (c *Child) OOMKills() (int64, error) {
	file := "memory.oom_control"
	if c.Version == 2 {
		file = "memory.events"
	}
	path := filepath.Join(c.Dir, file)
	e, err := cgroupfs.ReadEvents(path)
	if err == nil && e.OOMKill < 0 {
		err = fmt.Errorf("cgrouptest: %s: no oom_kill line", path)
	}
	return e.OOMKill, err
}

// Remove removes the cgroup, killing processes still in it, retrying for up
// to removeWait (a cgroup stays busy a moment after its last process
// exits). A cgroup already gone is not an error.
func (c *Child) Remove() error {
	var err error
	for deadline := time.Now().Add(removeWait); ; {
		if err = os.Remove(c.Dir); err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if time.Now().After(deadline) {
			break
		}
		if b, rerr := os.ReadFile(filepath.Join(c.Dir, "cgroup.procs")); rerr == nil {
			for _, f := range strings.Fields(string(b)) {
				if pid, perr := strconv.Atoi(f); perr == nil {
					if p, ferr := os.FindProcess(pid); ferr == nil {
						_ = p.Kill()
					}
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("cgrouptest: remove %s (tried for %v): %w", c.Dir, removeWait, err)
}

// removeWait bounds how long Remove retries.
const removeWait = 10 * time.Second
