package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/memctl/memctl/internal/cgroupfs"
)

// cgroupParent is this process's own memory cgroup, under which each arm's
// child cgroup is made.
type cgroupParent struct {
	dir     string
	version int
}

// findCgroupParent returns this process's memory cgroup (the v1 memory
// controller where it is mounted, else cgroup v2) when a child cgroup with a
// memory limit can be made in it: the process is root and, in v2, the memory
// controller can be enabled for children (it cannot where the cgroup holds
// processes itself, the "no internal processes" rule). The error says why
// not.
func findCgroupParent() (*cgroupParent, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("not root")
	}
	l, err := cgroupfs.Of(0)
	if err != nil {
		return nil, err
	}
	p := &cgroupParent{dir: l.Dir, version: l.Version}
	if p.version == 2 {
		ctl := filepath.Join(p.dir, "cgroup.subtree_control")
		b, err := os.ReadFile(ctl)
		if err != nil {
			return nil, err
		}
		if !slices.Contains(strings.Fields(string(b)), "memory") {
			if err := os.WriteFile(ctl, []byte("+memory"), 0); err != nil {
				return nil, fmt.Errorf("memory controller not delegated: %s: %w", ctl, err)
			}
		}
	}
	return p, nil
}

// cgroup is one arm's child memory cgroup.
type cgroup struct {
	dir     string
	version int
}

// newChild makes the child cgroup name with a memory limit of limit bytes
// (memory.limit_in_bytes in v1, memory.max in v2) and no swap beyond it
// where the kernel accounts swap.
func (p *cgroupParent) newChild(name string, limit int64) (*cgroup, error) {
	dir := filepath.Join(p.dir, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	g := &cgroup{dir: dir, version: p.version}
	file, swap, swapVal := "memory.limit_in_bytes", "memory.memsw.limit_in_bytes", strconv.FormatInt(limit, 10)
	if p.version == 2 {
		file, swap, swapVal = "memory.max", "memory.swap.max", "0"
	}
	if err := os.WriteFile(filepath.Join(dir, file), []byte(strconv.FormatInt(limit, 10)), 0); err != nil {
		_ = g.remove()
		return nil, fmt.Errorf("set limit: %w", err)
	}
	// Absent without swap accounting: the limit is then memory only.
	_ = os.WriteFile(filepath.Join(dir, swap), []byte(swapVal), 0)
	return g, nil
}

// wrap changes cmd so that the process enters the cgroup before it runs
// cmd's program: /bin/sh writes its own PID to cgroup.procs and then execs
// the program under the same PID, so every page the program touches is
// charged to the cgroup. Call it before cmd.Start.
func (g *cgroup) wrap(cmd *exec.Cmd) {
	procs := filepath.Join(g.dir, "cgroup.procs")
	cmd.Args = append([]string{"/bin/sh", "-c", `echo $$ > "$0" && exec "$@"`, procs, cmd.Path}, cmd.Args[1:]...)
	cmd.Path = "/bin/sh"
}

// oomKills returns how many processes of the cgroup the OOM killer killed:
// the oom_kill line of memory.oom_control (v1, Linux 4.13 and later) or
// memory.events (v2).
func (g *cgroup) oomKills() (int64, error) {
	file := "memory.oom_control"
	if g.version == 2 {
		file = "memory.events"
	}
	path := filepath.Join(g.dir, file)
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == "oom_kill" {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: malformed line %q", path, line)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("%s: no oom_kill line", path)
}

// remove removes the cgroup once its processes have exited, killing any
// that are left, and retrying for up to a second (a v1 cgroup may stay busy
// for a moment after its last process exits).
func (g *cgroup) remove() error {
	var err error
	for range 50 {
		if err = os.Remove(g.dir); err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if b, rerr := os.ReadFile(filepath.Join(g.dir, "cgroup.procs")); rerr == nil {
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
	return fmt.Errorf("bench: remove cgroup %s: %w", g.dir, err)
}
