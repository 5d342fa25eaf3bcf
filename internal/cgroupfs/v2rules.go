package cgroupfs

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"github.com/memctl/memctl/internal/safefs"
)

// v2LimitFiles returns the files that bound the memory of a cgroup v2
// process in dirs (the cgroup and its ancestors, nearest first): each
// directory's memory.max, then its memory.high. memory.max is the hard
// limit (the OOM killer runs above it); memory.high is the throttle limit
// (above it the kernel reclaims from the cgroup and stalls its allocating
// tasks, Documentation/admin-guide/cgroup-v2.rst, "memory.high"). systemd's
// MemoryHigh= and Kubernetes Memory QoS write memory.high, so a process can
// be held far below its memory.max: the effective limit is the smallest of
// all of them. memory.max comes first so that it is named when the two are
// equal.
func v2LimitFiles(dirs []string) []string {
	files := make([]string, 0, 2*len(dirs))
	for _, d := range dirs {
		files = append(files, filepath.Join(d, "memory.max"), filepath.Join(d, "memory.high"))
	}
	return files
}

// errNoV2Memory is the error of a v2 hierarchy without the memory
// controller; it matches ErrNoCgroup.
var errNoV2Memory = fmt.Errorf("%w (v2 without the memory controller)", ErrNoCgroup)

// v2Memory returns an error matching ErrNoCgroup when the cgroup v2
// hierarchy mounted at top does not have the memory controller: its
// cgroup.controllers (the controllers available to the mounted cgroup and
// below it) does not list "memory". That is the v2 hierarchy of a hybrid
// host, where the memory controller is bound to v1, or a cgroup the memory
// controller was not delegated to; no memory.max or memory.high can apply
// then. A top without cgroup.controllers (not a cgroup2 file system) is not
// checked.
func (s *source) v2Memory(top string) error {
	file := filepath.Join(top, "cgroup.controllers")
	b, err := s.readFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cgroupfs: %w", err)
	}
	for _, c := range strings.Fields(string(b)) {
		if c == "memory" {
			return nil
		}
	}
	return fmt.Errorf("%w: no memory controller in cgroup v2: %s lists %s", errNoV2Memory, safefs.Quote(file), safefs.Quote(strings.TrimSpace(string(b))))
}
