package cgroupfs

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"

	"github.com/memctl/memctl/internal/fastread"
	"github.com/memctl/memctl/internal/safefs"
)

// unlimitedFrom is the smallest value read as no limit: v1 writes an unset
// limit as PAGE_COUNTER_MAX pages (9223372036854771712 with 4 KiB pages);
// 4 EiB or more is beyond any machine.
const unlimitedFrom = 1 << 62

// parseLimit parses a limit file's value, ASCII spaces around a decimal
// byte count, or "max" when allowMax (v2). Values of unlimitedFrom or more
// are NoLimit. Only the error allocates.
func parseLimit[T string | []byte](s T, allowMax bool) (int64, error) {
	if n, ok := limitValue([]byte(s), allowMax); ok {
		return n, nil
	}
	q := safefs.Quote(strings.TrimSpace(string(s)))
	if allowMax {
		return 0, fmt.Errorf("malformed limit %s, want bytes or \"max\"", q)
	}
	return 0, fmt.Errorf("malformed limit %s, want bytes", q)
}

// limitValue is parseLimit; ok is false where parseLimit errs.
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

type fileKind uint8

const (
	v1Limit fileKind = iota // memory.limit_in_bytes
	v1Stat                  // memory.stat's hierarchical_memory_limit
	v2Max                   // memory.max
	v2High                  // memory.high
)

// limitFile is one file a limit is read from; f and absent are Self's.
type limitFile struct {
	name   string
	kind   fileKind
	top    bool          // v2: the memory.max of the mount's top cgroup
	absent bool          // absent when Self resolved: it must stay so
	f      fastread.File // kept open by Self
}

// limitFiles returns the files of the limit of cgroup directory dir below
// the mount point top, nearest first: v1 memory.limit_in_bytes of dir and
// each ancestor, then dir's memory.stat; v2 memory.max and memory.high.
func limitFiles(version int, dir, top string) []limitFile {
	var files []limitFile
	for _, d := range ancestors(dir, top) {
		if version == 1 {
			files = append(files, limitFile{name: filepath.Join(d, "memory.limit_in_bytes"), kind: v1Limit})
			continue
		}
		files = append(files, limitFile{name: filepath.Join(d, "memory.max"), kind: v2Max, top: d == top},
			limitFile{name: filepath.Join(d, "memory.high"), kind: v2High})
	}
	if version == 1 {
		files = append(files, limitFile{name: filepath.Join(dir, "memory.stat"), kind: v1Stat})
	}
	return files
}

// readLimit reads files through read into l (Version, Cgroup, Dir set).
// An absent v2 file or memory.stat is passed over; a bad memory.high goes
// to HighErr, a bad memory.stat to StatErr when a limit file sets a limit.
// Only errors and l.Bounds past its capacity allocate.
func readLimit(l Limit, files []limitFile, read func(*limitFile) ([]byte, error)) (Limit, error) {
	l.Bytes, l.Max, l.High = NoLimit, NoLimit, NoLimit
	for i := range files {
		f := &files[i]
		b, err := read(f)
		if errors.Is(err, fs.ErrNotExist) && f.kind != v1Limit {
			continue
		}
		v, err := f.value(b, err)
		switch {
		case err == nil:
		case f.kind == v2High:
			l.HighErr = cmp.Or(l.HighErr, err)
			continue
		case f.kind == v1Stat && l.Bytes != NoLimit:
			l.StatErr = err
			continue
		default:
			return Limit{}, err
		}
		l.TopNotRoot = l.TopNotRoot || f.top // the root cgroup has no memory.max
		if f.kind == v1Stat && !tighter(v, l.Bytes) {
			continue
		}
		if tighter(v, l.Bytes) {
			l.Bytes, l.File = v, f.name
		}
		if f.kind == v2High {
			if tighter(v, l.High) {
				l.High, l.HighFile = v, f.name
			}
			continue
		}
		if v != NoLimit {
			l.Bounds = append(l.Bounds, Bound{v, f.name})
		}
		if tighter(v, l.Max) {
			l.Max, l.MaxFile = v, f.name
		}
	}
	if l.Version == 1 {
		l.Max, l.MaxFile, l.High = l.Bytes, l.File, NoLimit
	}
	return l, nil
}

// value parses b, f's content read with error err. A memory.stat without
// hierarchical_memory_limit is NoLimit.
func (f *limitFile) value(b []byte, err error) (int64, error) {
	if err != nil {
		return 0, fmt.Errorf("cgroupfs: %w", err)
	}
	key := ""
	if f.kind == v1Stat {
		var found bool
		if b, found = statLine(b, "hierarchical_memory_limit"); !found {
			return NoLimit, nil
		}
		key = "hierarchical_memory_limit: "
	}
	v, err := parseLimit(b, f.kind == v2Max || f.kind == v2High)
	if err != nil {
		return 0, fmt.Errorf("cgroupfs: %s: %s%w", safefs.Quote(f.name), key, err)
	}
	return v, nil
}

// limit reads the limit of cgroup cg, of version 1 or 2, through c. In v2,
// c.top must list the memory controller (v2Memory) and c.dir exist.
func (s *source) limit(version int, cg string, c candidate) (Limit, error) {
	if version == 2 {
		if err := s.v2Memory(c.top); err != nil {
			return Limit{}, err
		}
		if err := s.stat(c.dir); err != nil {
			if errors.Is(err, fs.ErrNotExist) && strings.HasSuffix(cg, deletedSuffix) {
				// proc_cgroup_show marks a removed cgroup so; a live one
				// whose name ends so was found above.
				return Limit{}, fmt.Errorf("%w: cgroup %s was removed (the kernel marks it %q): its limit cannot be read", ErrNoCgroup, safefs.Quote(strings.TrimSuffix(cg, deletedSuffix)), deletedSuffix)
			}
			return Limit{}, fmt.Errorf("cgroupfs: %w", err)
		}
	}
	l := Limit{Version: version, Cgroup: cg, Dir: c.dir}
	return readLimit(l, limitFiles(version, c.dir, c.top), func(f *limitFile) ([]byte, error) { return s.readFile(f.name) })
}

// deletedSuffix marks a removed cgroup in a /proc/PID/cgroup v2 line.
const deletedSuffix = " (deleted)"

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
	if slices.Contains(strings.Fields(string(b)), "memory") {
		return nil
	}
	return fmt.Errorf("%w: no memory controller in cgroup v2: %s lists %s", errNoV2Memory, safefs.Quote(file), safefs.Quote(strings.TrimSpace(string(b))))
}
