// Package cgrouptest creates a real child memory cgroup (v1 memory controller,
// or v2 where the memory controller is delegated) under the test process's
// own cgroup, runs commands inside it, and removes it when the test ends.
//
// Tests that need it skip, with the reason, when the process is not root or
// no writable memory cgroup exists.
package cgrouptest

import (
	"bufio"
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
// its version: the v1 memory hierarchy when mounted, else the v2 hierarchy
// when its memory controller can be enabled for children.
func ownMemoryCgroup() (string, int, error) {
	mounts, err := cgroupMounts()
	if err != nil {
		return "", 0, err
	}
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	var v1, v2 string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			if m, ok := mounts["cgroup2"]; ok {
				v2 = filepath.Join(m, parts[2])
			}
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "memory" {
				if m, ok := mounts["memory"]; ok {
					v1 = filepath.Join(m, parts[2])
				}
			}
		}
	}
	if v1 != "" {
		if _, err := os.Stat(filepath.Join(v1, "memory.limit_in_bytes")); err == nil {
			return v1, 1, nil
		}
	}
	if v2 != "" {
		ctl, err := os.ReadFile(filepath.Join(v2, "cgroup.controllers"))
		if err == nil && strings.Contains(" "+string(ctl)+" ", " memory") {
			// Enabling memory for children fails where the cgroup holds
			// processes itself (the "no internal processes" rule).
			if err := os.WriteFile(filepath.Join(v2, "cgroup.subtree_control"), []byte("+memory"), 0); err != nil {
				return "", 0, fmt.Errorf("enable memory controller in %s: %w", v2, err)
			}
			return v2, 2, nil
		}
		return "", 0, fmt.Errorf("cgroup v2 at %s has no memory controller", v2)
	}
	return "", 0, errors.New("no cgroup memory controller mounted")
}

// cgroupMounts maps "memory" to the v1 memory hierarchy's mount point and
// "cgroup2" to the v2 mount point, from /proc/self/mountinfo.
func cgroupMounts() (map[string]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m := make(map[string]string)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		a, b := strings.Fields(pre), strings.Fields(post)
		if len(a) < 5 || len(b) < 3 {
			continue
		}
		switch b[0] {
		case "cgroup2":
			m["cgroup2"] = a[4]
		case "cgroup":
			for _, o := range strings.Split(b[2], ",") {
				if o == "memory" {
					m["memory"] = a[4]
				}
			}
		}
	}
	return m, sc.Err()
}
