package cgrouptest

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memctl/memctl/internal/cgroupfs"
)

// Layout is one way a container runtime shows a process its cgroup v2
// memory limit.
type Layout struct {
	Name string // for subtest names: "host", "container", "pod", "readonly", "wholetree"
	// Namespace: the child runs in a new cgroup namespace rooted at its own
	// cgroup (/proc/self/cgroup shows "0::/").
	Namespace bool
	// Remount: cgroup2 is mounted anew at /sys/fs/cgroup in a private mount
	// namespace, its top the namespace root; without it the child keeps the
	// host's mount and sees the whole tree.
	Remount    bool
	ReadOnly   bool // the new mount is read-only (Docker's and Kubernetes' default)
	LimitAbove bool // the limit is on the parent of the child's cgroup (pod-level resources)
}

// The layouts containers use. The child's cgroup is always a fresh leaf,
// made by NewV2, with memory.swap.max 0.
var (
	// LayoutHost: the host's cgroup namespace and mount (a systemd service).
	LayoutHost = Layout{Name: "host"}
	// LayoutContainer: a private cgroup namespace rooted at the limit,
	// cgroup2 remounted read-write (--cgroupns=private).
	LayoutContainer = Layout{Name: "container", Namespace: true, Remount: true}
	// LayoutPod: as LayoutContainer, the limit on the namespace root's parent.
	LayoutPod = Layout{Name: "pod", Namespace: true, Remount: true, LimitAbove: true}
	// LayoutReadOnly: as LayoutContainer with cgroup2 mounted read-only.
	LayoutReadOnly = Layout{Name: "readonly", Namespace: true, Remount: true, ReadOnly: true}
	// LayoutWholeTree: a new cgroup namespace, the host's mount kept, the
	// limit on the parent.
	LayoutWholeTree = Layout{Name: "wholetree", Namespace: true, LimitAbove: true}
)

// Layouts returns every layout, LayoutHost first.
func Layouts() []Layout {
	return []Layout{LayoutHost, LayoutContainer, LayoutPod, LayoutReadOnly, LayoutWholeTree}
}

// RequireV2 skips t, with the reason, unless this process can make child
// cgroups with a memory limit on cgroup v2 (root, the memory controller
// available and enabled for children). It returns the process's own cgroup
// directory, where NewV2 makes cgroups.
func RequireV2(t testing.TB) string {
	t.Helper()
	const need = "cgrouptest: needs a writable cgroup v2 memory controller (run by internal/v2vm): "
	p, err := WritableParent()
	if err != nil {
		t.Skipf(need+"%v", err)
	}
	if p.Version != 2 {
		t.Skipf(need+"this process's memory cgroup %s is cgroup v%d", p.Dir, p.Version)
	}
	b, err := os.ReadFile(filepath.Join(p.Dir, "cgroup.controllers"))
	if err != nil || !slices.Contains(strings.Fields(string(b)), "memory") {
		t.Skipf(need+"no memory controller in %s/cgroup.controllers (%v)", p.Dir, err)
	}
	return p.Dir
}

// V2 is a fresh cgroup v2 memory cgroup for one test, laid out as Layout:
// Top and the leaf Dir below it, where Wrap places a command. The end of
// the test removes it, killing what still runs. Not safe for concurrent use.
type V2 struct {
	Layout Layout
	// Top is the cgroup made for the test, Dir's parent.
	Top string
	// Dir is the leaf cgroup the command runs in (host path).
	Dir string
	// LimitDir is where the limit was written: Dir, or Top when
	// Layout.LimitAbove. SetMax and SetHigh write there.
	LimitDir string
	// Limit is the memory.max written at creation, in bytes.
	Limit int64
	// Mount is the cgroup2 mount point that holds Dir.
	Mount string
}

// NewV2 makes Top and Dir (after RequireV2), writes limit bytes to
// LimitDir's memory.max and 0 to memory.swap.max.
func NewV2(t testing.TB, l Layout, limit int64) *V2 {
	t.Helper()
	parent := RequireV2(t)
	if limit <= 0 {
		t.Fatalf("cgrouptest: limit %d: want a positive byte count", limit)
	}
	mnt, err := cgroup2Mount(parent)
	if err != nil {
		t.Skipf("cgrouptest: %v", err)
	}
	top := filepath.Join(parent, fmt.Sprintf("memctl-v2-%s-%d-%d", l.Name, os.Getpid(), time.Now().UnixNano()))
	if err := os.Mkdir(top, 0o755); err != nil {
		t.Fatalf("cgrouptest: %v", err)
	}
	g := &V2{Layout: l, Top: top, Dir: filepath.Join(top, "c"), Limit: limit, Mount: mnt}
	t.Cleanup(func() {
		for _, d := range []string{g.Dir, g.Top} {
			if err := (&Child{Dir: d, Version: 2}).Remove(); err != nil {
				t.Errorf("cgrouptest: %v", err)
			}
		}
	})
	// The memory controller for Dir: Top holds no process, so this works.
	g.write(t, filepath.Join(top, "cgroup.subtree_control"), "+memory")
	if err := os.Mkdir(g.Dir, 0o755); err != nil {
		t.Fatalf("cgrouptest: %v", err)
	}
	g.LimitDir = g.Dir
	if l.LimitAbove {
		g.LimitDir = top
	}
	g.SetMax(t, limit)
	for _, d := range []string{top, g.Dir} {
		// Absent without swap accounting: the limit is then memory only.
		_ = os.WriteFile(filepath.Join(d, "memory.swap.max"), []byte("0"), 0)
	}
	return g
}

// SetMax writes bytes to LimitDir's memory.max; a negative value writes
// "max" (no limit). It fails t on error.
func (g *V2) SetMax(t testing.TB, bytes int64) {
	t.Helper()
	g.write(t, filepath.Join(g.LimitDir, "memory.max"), limitString(bytes))
}

// SetHigh writes bytes to LimitDir's memory.high; a negative value writes
// "max" (no throttling). It fails t on error.
func (g *V2) SetHigh(t testing.TB, bytes int64) {
	t.Helper()
	g.write(t, filepath.Join(g.LimitDir, "memory.high"), limitString(bytes))
}

func limitString(bytes int64) string {
	if bytes < 0 {
		return "max"
	}
	return strconv.FormatInt(bytes, 10)
}

func (g *V2) write(t testing.TB, path, value string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(value), 0); err != nil {
		t.Fatalf("cgrouptest: write %q to %s: %v", value, path, err)
	}
}

// Events returns the counters of memory.events in dir (Dir or LimitDir),
// -1 for one the file lacks; it fails t on a malformed file.
func (g *V2) Events(t testing.TB, dir string) map[string]int64 {
	t.Helper()
	e, err := cgroupfs.ReadEvents(filepath.Join(dir, "memory.events"))
	if err != nil {
		t.Fatalf("cgrouptest: %v", err)
	}
	return maps.Collect(e.All())
}

// Current returns Dir's memory.current in bytes.
func (g *V2) Current(t testing.TB) int64 {
	t.Helper()
	n, _, err := cgroupfs.ReadUsage(2, g.Dir)
	if err != nil {
		t.Fatalf("cgrouptest: %v", err)
	}
	return n
}

// RequireSwap skips t, with the reason, unless /proc/swaps lists a device.
func RequireSwap(t testing.TB) {
	t.Helper()
	b, err := os.ReadFile("/proc/swaps")
	if err != nil || len(strings.Split(strings.TrimSpace(string(b)), "\n")) < 2 {
		t.Skipf("cgrouptest: no swap here (/proc/swaps lists none; the v2 VM has zram): %v", err)
	}
}

// SetSwapMax writes bytes to memory.swap.max of Top and Dir (NewV2
// writes 0); a negative value writes "max". It fails t on error.
func (g *V2) SetSwapMax(t testing.TB, bytes int64) {
	t.Helper()
	for _, d := range []string{g.Top, g.Dir} {
		g.write(t, filepath.Join(d, "memory.swap.max"), limitString(bytes))
	}
}
