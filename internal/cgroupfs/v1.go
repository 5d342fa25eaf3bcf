package cgroupfs

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"github.com/memctl/memctl/internal/safefs"
)

// readV1 reads memory.limit_in_bytes up to the mount point, and memory.stat.
func (s *source) readV1(cg, dir, top string) (Limit, error) {
	l := Limit{Version: 1, Cgroup: cg, Dir: dir, Bytes: NoLimit}
	for _, d := range ancestors(dir, top) {
		file := filepath.Join(d, "memory.limit_in_bytes")
		b, err := s.readFile(file)
		if err != nil {
			return Limit{}, fmt.Errorf("cgroupfs: %w", err)
		}
		v, err := parseLimit(string(b), false)
		if err != nil {
			return Limit{}, fmt.Errorf("cgroupfs: %s: %w", safefs.Quote(file), err)
		}
		if v != NoLimit {
			l.Bounds = append(l.Bounds, Bound{v, file})
		}
		if v != NoLimit && (l.Bytes == NoLimit || v < l.Bytes) {
			l.Bytes, l.File = v, file
		}
	}
	stat := filepath.Join(dir, "memory.stat")
	h, ok, err := s.hierarchicalLimit(stat)
	if err != nil {
		if l.Bytes == NoLimit {
			return Limit{}, err // "no limit" would be a guess
		}
		// memory.stat only adds a limit set above the mount.
		l.StatErr = err
	}
	if ok && h != NoLimit && (l.Bytes == NoLimit || h < l.Bytes) {
		l.Bytes, l.File = h, stat
		l.Bounds = append(l.Bounds, Bound{h, stat})
	}
	l.Max, l.MaxFile, l.High = l.Bytes, l.File, NoLimit
	return l, nil
}

// hierarchicalLimit reads memory.stat's hierarchical_memory_limit; ok is
// false when the file or the key is absent.
func (s *source) hierarchicalLimit(file string) (int64, bool, error) {
	b, err := s.readFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("cgroupfs: %w", err)
	}
	v, found := statLine(b, "hierarchical_memory_limit")
	if !found {
		return 0, false, nil
	}
	n, err := parseLimit(string(v), false)
	if err != nil {
		return 0, false, fmt.Errorf("cgroupfs: %s: hierarchical_memory_limit: %w", safefs.Quote(file), err)
	}
	return n, true, nil
}
