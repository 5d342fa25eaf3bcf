package cgroupfs

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"github.com/memctl/memctl/internal/safefs"
)

// readV2 reads memory.max and memory.high of dir and its ancestors up to
// the mount point, memory.max named when equal. dir must exist; a bad
// memory.high is kept aside in HighErr.
func (s *source) readV2(cg, dir, top string) (Limit, error) {
	if err := s.stat(dir); err != nil {
		if errors.Is(err, fs.ErrNotExist) && strings.HasSuffix(cg, deletedSuffix) {
			// proc_cgroup_show marks a removed cgroup so; a live one
			// whose name ends so was found above.
			return Limit{}, fmt.Errorf("%w: cgroup %s was removed (the kernel marks it %q): its limit cannot be read", ErrNoCgroup, safefs.Quote(strings.TrimSuffix(cg, deletedSuffix)), deletedSuffix)
		}
		return Limit{}, fmt.Errorf("cgroupfs: %w", err)
	}
	l := Limit{Version: 2, Cgroup: cg, Dir: dir, Bytes: NoLimit, Max: NoLimit, High: NoLimit}
	topMax := filepath.Join(top, "memory.max")
	for _, file := range limitFiles(ancestors(dir, top)) {
		b, err := s.readFile(file)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil && filepath.Base(file) == "memory.high" {
			l.HighErr = cmp.Or(l.HighErr, fmt.Errorf("cgroupfs: %w", err))
			continue
		}
		if err != nil {
			return Limit{}, fmt.Errorf("cgroupfs: %w", err)
		}
		if file == topMax {
			l.TopNotRoot = true // the root cgroup has no memory.max
		}
		v, err := parseLimit(string(b), true)
		isMax := filepath.Base(file) == "memory.max"
		if err != nil && !isMax {
			l.HighErr = cmp.Or(l.HighErr, fmt.Errorf("cgroupfs: %s: %w", safefs.Quote(file), err))
			continue
		}
		if err != nil {
			return Limit{}, fmt.Errorf("cgroupfs: %s: %w", safefs.Quote(file), err)
		}
		if tighter(v, l.Bytes) {
			l.Bytes, l.File = v, file
		}
		if isMax {
			if v != NoLimit {
				l.Bounds = append(l.Bounds, Bound{v, file})
			}
			if tighter(v, l.Max) {
				l.Max, l.MaxFile = v, file
			}
		} else if tighter(v, l.High) {
			l.High, l.HighFile = v, file
		}
	}
	return l, nil
}

// deletedSuffix marks a removed cgroup in a /proc/PID/cgroup v2 line.
const deletedSuffix = " (deleted)"

// limitFiles returns memory.max and memory.high of each of dirs, in order.
func limitFiles(dirs []string) []string {
	files := make([]string, 0, 2*len(dirs))
	for _, d := range dirs {
		files = append(files, filepath.Join(d, "memory.max"), filepath.Join(d, "memory.high"))
	}
	return files
}

// errNoV2Memory (matching ErrNoCgroup): a v2 hierarchy without memory.
var errNoV2Memory = fmt.Errorf("%w (v2 without the memory controller)", ErrNoCgroup)

// v2Memory returns errNoV2Memory when the cgroup.controllers of the mount
// at top lacks "memory" (a hybrid host, or no delegation); a top without
// cgroup.controllers is not checked.
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
