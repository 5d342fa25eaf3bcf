package cgroupfs

import (
	"bytes"
	"errors"
	"io/fs"
	"path/filepath"
	"slices"

	"github.com/memctl/memctl/internal/fastread"
	"github.com/memctl/memctl/internal/safefs"
)

// Self reads the memory limit of the caller's own cgroup again and again,
// as Of(0) does. While /proc/self/cgroup reads as at the first Read, a
// later Read re-reads only the limit files found then, kept open, and
// allocates nothing; anything unexpected (a file gone or appeared, a bad
// value, several mounts, another view, a partial read) or Reset makes the
// next Read call Of(0) again. MemoryStat and KmemUsage read cgroup
// accounts the same way. The zero value is ready. A Self is not safe for
// concurrent use; the Bounds of a Limit it returns are valid until its
// next Read.
type Self struct {
	procCgroup fastread.File
	seen       []byte      // /proc/self/cgroup as resolved
	l          Limit       // Version, Cgroup and Dir as resolved
	files      []limitFile // nil: resolve at the next Read
	buf        []byte
	bounds     []Bound
	stats      []statFiles // the accounts read, by directory
}

// statFiles are one cgroup directory's account files, kept open by Self.
type statFiles struct {
	dir        string
	stat, kmem fastread.File
}

// maxStatDirs bounds the directories whose account files a Self keeps.
const maxStatDirs = 16

var (
	errChanged = errors.New("cgroupfs: changed since resolved") // a kept file found otherwise than when resolved
	errNotKept = errors.New("cgroupfs: too many cgroup directories to keep their files open")
)

// Reset makes the next Read resolve the cgroup again, and closes the files
// kept open; a later MemoryStat or KmemUsage opens them again.
func (s *Self) Reset() {
	s.procCgroup.Close()
	closeFiles(s.files)
	s.files = nil
	for i := range s.stats {
		s.stats[i].stat.Close()
		s.stats[i].kmem.Close()
	}
}

func closeFiles(files []limitFile) {
	for i := range files {
		files[i].f.Close()
	}
}

// Read returns the memory limit of the caller's cgroup, as Of(0) does.
func (s *Self) Read() (Limit, error) {
	if s.files != nil {
		var err error
		s.buf, err = s.procCgroup.Read(s.buf, safefs.MaxProcFile)
		if err == nil && bytes.Equal(s.buf, s.seen) {
			if l, ok := s.reread(); ok {
				return l, nil
			}
		}
		s.Reset()
	}
	if s.procCgroup.String() == "" {
		s.procCgroup, _ = fastread.New("/proc/self/cgroup") // a fixed name: no error
	}
	seen, serr := s.procCgroup.Read(s.seen, safefs.MaxProcFile)
	s.seen = seen
	l, view, used, err := ofPID(0)
	if err == nil && serr == nil && view == ViewProcess && len(used) == 1 && used[0].search == 0 &&
		l.HighErr == nil && l.StatErr == nil && len(l.Unreadable) == 0 {
		s.keep(l, used[0].top)
	}
	return l, err
}

// keep keeps l's limit files, read through the mount whose top cgroup
// directory is top, unless one cannot be read again as it was (its name
// holds a NUL, or it fails other than as absent).
func (s *Self) keep(l Limit, top string) {
	files := limitFiles(l.Version, l.Dir, top)
	for i := range files {
		f := &files[i]
		var err error
		if f.f, err = fastread.New(f.name); err == nil {
			s.buf, err = f.f.Read(s.buf, safefs.MaxCgroupFile)
			f.absent = errors.Is(err, fs.ErrNotExist) && f.kind != v1Limit
		}
		if err != nil && !f.absent {
			closeFiles(files)
			return
		}
	}
	s.l, s.files = Limit{Version: l.Version, Cgroup: l.Cgroup, Dir: l.Dir}, files
}

// reread reads the kept files again as Of(0) does; ok is false when one
// is found otherwise than when resolved.
func (s *Self) reread() (Limit, bool) {
	l := s.l
	l.Bounds = s.bounds[:0]
	l, err := readLimit(l, s.files, func(f *limitFile) ([]byte, error) {
		var err error
		s.buf, err = f.f.Read(s.buf, safefs.MaxCgroupFile)
		if f.absent != errors.Is(err, fs.ErrNotExist) {
			return nil, errChanged
		}
		return s.buf, err
	})
	if err != nil || l.HighErr != nil || l.StatErr != nil {
		return Limit{}, false
	}
	if s.bounds = l.Bounds; len(l.Bounds) == 0 {
		l.Bounds = nil
	}
	return l, true
}

// MemoryStat parses dir's memory.stat as ReadMemoryStat does, and returns
// its path, through a file kept open (for up to 16 directories), without
// allocating once warm; it checks no file system: on an error, read dir
// with ReadMemoryStat.
func (s *Self) MemoryStat(dir string) (MemoryStat, string, error) {
	f, err := s.readStat(dir, false)
	if err != nil {
		return missingMemoryStat(), "", err
	}
	st, err := ParseMemoryStat(s.buf, f.String())
	return st, f.String(), err
}

// KmemUsage parses dir's v1 memory.kmem.usage_in_bytes, as ReadKmemUsage
// does, kept open as MemoryStat's memory.stat; an absent file is an error
// matching fs.ErrNotExist.
func (s *Self) KmemUsage(dir string) (int64, error) {
	f, err := s.readStat(dir, true)
	if err != nil {
		return 0, err
	}
	return ParseKmemUsage(s.buf, f.String())
}

// readStat reads dir's memory.stat, or memory.kmem.usage_in_bytes when
// kmem, into s.buf through its kept file, which it returns.
func (s *Self) readStat(dir string, kmem bool) (*fastread.File, error) {
	i := slices.IndexFunc(s.stats, func(f statFiles) bool { return f.dir == dir })
	if i < 0 {
		if len(s.stats) >= maxStatDirs {
			return nil, errNotKept
		}
		stat, err := fastread.New(filepath.Join(dir, "memory.stat"))
		if err != nil {
			return nil, err
		}
		k, _ := fastread.New(filepath.Join(dir, "memory.kmem.usage_in_bytes")) // dir holds no NUL: no error
		i, s.stats = len(s.stats), append(s.stats, statFiles{dir, stat, k})
	}
	f := &s.stats[i].stat
	if kmem {
		f = &s.stats[i].kmem
	}
	var err error
	s.buf, err = f.Read(s.buf, safefs.MaxCgroupFile)
	return f, err
}
