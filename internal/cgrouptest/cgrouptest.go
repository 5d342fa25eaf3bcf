// Package cgrouptest creates a real child memory cgroup (v1 memory controller,
// or v2 where the memory controller is delegated) under the test process's
// own cgroup, runs commands inside it, and removes it when the test ends.
//
// Tests that need it skip, with the reason, when the process is not root or
// no writable memory cgroup exists.
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

// Group is one child memory cgroup with a limit.
type Group struct {
	// Dir is the cgroup's directory, for example
	// /sys/fs/cgroup/memory/<own path>/memctl-test-123.
	Dir string
	// Version is 1 or 2.
	Version int
	// Limit is the memory limit in bytes written to memory.limit_in_bytes (v1)
	// or memory.max (v2).
	Limit int64
}

// New creates a child memory cgroup with the given limit in bytes and removes
// it at the end of the test. It skips t, naming the reason, when that is not
// possible here.
func New(t testing.TB, limit int64) *Group {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("cgrouptest: needs root to create a memory cgroup")
	}
	parent, version, err := ownMemoryCgroup()
	if err != nil {
		t.Skipf("cgrouptest: no writable memory cgroup: %v", err)
	}
	dir := filepath.Join(parent, fmt.Sprintf("memctl-test-%d-%d", os.Getpid(), time.Now().UnixNano()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cgrouptest: cannot create %s: %v", dir, err)
	}
	g := &Group{Dir: dir, Version: version, Limit: limit}
	t.Cleanup(func() { g.remove(t) })
	file := "memory.limit_in_bytes"
	if version == 2 {
		file = "memory.max"
	}
	if err := os.WriteFile(filepath.Join(dir, file), []byte(strconv.FormatInt(limit, 10)), 0); err != nil {
		t.Fatalf("cgrouptest: set limit: %v", err)
	}
	if version == 1 {
		// Without swap accounting the limit is memory only; where memsw
		// exists, cap it too so that the limit cannot be escaped into swap.
		_ = os.WriteFile(filepath.Join(dir, "memory.memsw.limit_in_bytes"), []byte(strconv.FormatInt(limit, 10)), 0)
	} else {
		_ = os.WriteFile(filepath.Join(dir, "memory.swap.max"), []byte("0"), 0)
	}
	return g
}

// Wrap changes cmd so that the process enters the cgroup before it executes
// cmd's program: /bin/sh writes its own PID to cgroup.procs and then execs the
// program, so no allocation of the program happens outside the limit. Call it
// before cmd.Start.
func (g *Group) Wrap(cmd *exec.Cmd) {
	procs := filepath.Join(g.Dir, "cgroup.procs")
	args := append([]string{"/bin/sh", "-c", `echo $$ > "$0" && exec "$@"`, procs, cmd.Path}, cmd.Args[1:]...)
	cmd.Path = "/bin/sh"
	cmd.Args = args
}

// OOMKills returns how many processes of the group the kernel OOM killer
// killed, from memory.oom_control (v1, "oom_kill", Linux 4.13 and later) or
// memory.events (v2, "oom_kill").
func (g *Group) OOMKills() (int64, error) {
	file := "memory.oom_control"
	if g.Version == 2 {
		file = "memory.events"
	}
	path := filepath.Join(g.Dir, file)
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == "oom_kill" {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("cgrouptest: %s: %q: %w", path, line, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("cgrouptest: %s: no oom_kill line", path)
}

func (g *Group) remove(t testing.TB) {
	var err error
	for i := 0; i < 50; i++ {
		if err = os.Remove(g.Dir); err == nil || errors.Is(err, os.ErrNotExist) {
			return
		}
		// Processes still in it: kill them, then retry.
		if b, rerr := os.ReadFile(filepath.Join(g.Dir, "cgroup.procs")); rerr == nil {
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
	t.Errorf("cgrouptest: could not remove %s: %v", g.Dir, err)
}

// ownMemoryCgroup returns the directory of this process's memory cgroup and
// its version (1 or 2), as cgroupfs finds them; a v2 cgroup qualifies only
// when its memory controller can be enabled for children.
func ownMemoryCgroup() (string, int, error) {
	l, err := cgroupfs.Of(0)
	if err != nil {
		return "", 0, err
	}
	if l.Version == 1 {
		return l.Dir, 1, nil
	}
	ctl, err := os.ReadFile(filepath.Join(l.Dir, "cgroup.controllers"))
	if err != nil || !slices.Contains(strings.Fields(string(ctl)), "memory") {
		return "", 0, fmt.Errorf("cgroup v2 at %s has no memory controller", l.Dir)
	}
	// Enabling memory for children fails where the cgroup holds processes
	// itself (the "no internal processes" rule).
	if err := os.WriteFile(filepath.Join(l.Dir, "cgroup.subtree_control"), []byte("+memory"), 0); err != nil {
		return "", 0, fmt.Errorf("enable memory controller in %s: %w", l.Dir, err)
	}
	return l.Dir, 2, nil
}
