package cgroupfs

import (
	"bytes"
	"errors"
	"io/fs"
	"path/filepath"

	"github.com/memctl/memctl/internal/fastread"
	"github.com/memctl/memctl/internal/safefs"
)

// newPlan returns where l's limit files are, l read through the one mount
// whose top cgroup directory is top, or nil when one cannot be read again
// as it was (its name holds a NUL, or it fails other than as absent).
func newPlan(l Limit, top string) *selfPlan {
	p := &selfPlan{l: Limit{Version: l.Version, Cgroup: l.Cgroup, Dir: l.Dir}}
	dirs := ancestors(l.Dir, top)
	var names []string
	switch l.Version {
	case 1:
		for _, d := range dirs {
			names = append(names, filepath.Join(d, "memory.limit_in_bytes"))
		}
		names = append(names, filepath.Join(l.Dir, "memory.stat"))
	case 2:
		names = limitFiles(dirs)
	default:
		return nil
	}
	topMax := filepath.Join(top, "memory.max")
	var buf []byte
	for _, name := range names {
		path, err := fastread.New(name)
		if err != nil {
			p.close()
			return nil
		}
		f := planFile{path: path, top: l.Version == 2 && name == topMax}
		switch {
		case l.Version == 1 && filepath.Base(name) == "memory.stat":
			f.kind = v1Stat
		case l.Version == 1:
			f.kind = v1Limit
		case filepath.Base(name) == "memory.max":
			f.kind = v2Max
		default:
			f.kind = v2High
		}
		buf, err = f.path.Read(buf, safefs.MaxCgroupFile)
		switch {
		case errors.Is(err, fs.ErrNotExist) && f.kind != v1Limit:
			f.absent = true
		case err != nil:
			p.close()
			return nil
		}
		p.files = append(p.files, f)
	}
	return p
}

// reread reads the plan's files again and returns the limit as readV1 or
// readV2 makes it; ok is false when anything differs from what the plan
// expects (the caller resolves again).
func (s *Self) reread() (l Limit, ok bool) {
	l = s.plan.l
	l.Bytes, l.Max, l.High = NoLimit, NoLimit, NoLimit
	s.bounds = s.bounds[:0]
	for i := range s.plan.files {
		f := &s.plan.files[i]
		var err error
		s.buf, err = f.path.Read(s.buf, safefs.MaxCgroupFile)
		if f.absent {
			if !errors.Is(err, fs.ErrNotExist) {
				return Limit{}, false
			}
			continue
		}
		if err != nil {
			return Limit{}, false
		}
		v, ok := s.value(f.kind)
		if !ok {
			return Limit{}, false
		}
		if f.top {
			l.TopNotRoot = true
		}
		file := f.path.String()
		if f.kind == v1Stat && !tighter(v, l.Bytes) {
			continue // only a tighter limit than the files' is added
		}
		if tighter(v, l.Bytes) {
			l.Bytes, l.File = v, file
		}
		switch f.kind {
		case v1Limit, v1Stat, v2Max:
			if v != NoLimit {
				s.bounds = append(s.bounds, Bound{v, file})
			}
			if tighter(v, l.Max) {
				l.Max, l.MaxFile = v, file
			}
		case v2High:
			if tighter(v, l.High) {
				l.High, l.HighFile = v, file
			}
		}
	}
	if l.Version == 1 {
		l.Max, l.MaxFile, l.High = l.Bytes, l.File, NoLimit
	}
	if len(s.bounds) > 0 {
		l.Bounds = s.bounds
	}
	return l, true
}

// value parses the file of kind in s.buf as parseLimit (or hierarchicalLimit)
// does; ok is false for anything parseLimit might read otherwise. A
// memory.stat without hierarchical_memory_limit is NoLimit.
func (s *Self) value(kind fileKind) (int64, bool) {
	b := s.buf
	if kind == v1Stat {
		var found bool
		if b, found = statLine(b, "hierarchical_memory_limit"); !found {
			return NoLimit, true
		}
	}
	return limitValue(b, kind == v2Max || kind == v2High)
}

// statLine returns the value of the first line "key value" of b.
func statLine(b []byte, key string) ([]byte, bool) {
	for rest := b; len(rest) > 0; {
		var line []byte
		line, rest = nextLine(rest)
		if v, ok := bytes.CutPrefix(line, []byte(key)); ok && len(v) > 0 && v[0] == ' ' {
			return v[1:], true
		}
	}
	return nil, false
}

// limitValue parses b as parseLimit does, when it is ASCII spaces around
// decimal digits or "max" (allowMax); ok is false otherwise.
func limitValue(b []byte, allowMax bool) (int64, bool) {
	b = bytes.Trim(b, " \t\n\v\f\r")
	if allowMax && string(b) == "max" {
		return NoLimit, true
	}
	n, ok := parseUint(b)
	if !ok {
		return 0, false
	}
	if n >= unlimitedFrom {
		return NoLimit, true
	}
	return int64(n), true
}
