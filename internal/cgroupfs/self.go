package cgroupfs

import (
	"bytes"

	"github.com/memctl/memctl/internal/fastread"
	"github.com/memctl/memctl/internal/safefs"
)

// Self reads the memory limit of the caller's own cgroup again and again.
// The first Read resolves the cgroup as Of(0) does (/proc/self/cgroup,
// mountinfo, every mount of the hierarchy). While /proc/self/cgroup reads
// as it did then, a later Read re-reads only the limit files found then,
// through package fastread (kept open) into a buffer the Self keeps, and
// allocates nothing. A read that fails or finds what it did not expect (a file gone
// or appeared, a value that does not parse), a move to another cgroup, or
// Reset makes the next Read resolve again through Of(0), whose Limit and
// error are returned as they are. A cgroup Of(0) reads in an unusual way
// (several mounts, a search by PID, another view, a partial read) is
// resolved again at every Read.
//
// The zero value is ready. A Self is not safe for concurrent use; the
// Bounds of a Limit it returns are valid until its next Read.
type Self struct {
	procCgroup fastread.File
	seen       []byte    // /proc/self/cgroup as resolved
	plan       *selfPlan // nil: resolve at the next Read
	buf        []byte
	bounds     []Bound
}

// selfPlan is where a resolved cgroup's limit files are.
type selfPlan struct {
	l     Limit // Version, Cgroup, Dir as resolved
	files []planFile
}

// planFile is one limit file of a selfPlan.
type planFile struct {
	path   fastread.File
	kind   fileKind
	absent bool // absent when resolved: it must stay so
	top    bool // v2: the memory.max of the mount's top cgroup
}

type fileKind uint8

const (
	v1Limit fileKind = iota // memory.limit_in_bytes
	v1Stat                  // memory.stat's hierarchical_memory_limit
	v2Max                   // memory.max
	v2High                  // memory.high
)

// Reset makes the next Read resolve the cgroup again, and closes the files
// kept open.
func (s *Self) Reset() {
	s.procCgroup.Close()
	if s.plan != nil {
		s.plan.close()
	}
	s.plan = nil
}

func (p *selfPlan) close() {
	for i := range p.files {
		p.files[i].path.Close()
	}
}

// Read returns the memory limit of the caller's cgroup, as Of(0) does.
func (s *Self) Read() (Limit, error) {
	if s.plan != nil {
		var err error
		s.buf, err = s.procCgroup.Read(s.buf, safefs.MaxProcFile)
		if err == nil && bytes.Equal(s.buf, s.seen) {
			if l, ok := s.reread(); ok {
				return l, nil
			}
		}
		s.Reset()
	}
	return s.resolve()
}

// resolve reads the limit as Of(0) does and keeps where its files are
// when it can re-read them alone.
func (s *Self) resolve() (Limit, error) {
	if s.procCgroup.String() == "" {
		p, err := fastread.New("/proc/self/cgroup")
		if err != nil {
			return Limit{}, err
		}
		s.procCgroup = p
	}
	seen, serr := s.procCgroup.Read(s.seen, safefs.MaxProcFile)
	s.seen = seen
	l, view, used, err := ofPID(0)
	if err == nil && serr == nil && view == ViewProcess && len(used) == 1 && used[0].search == 0 &&
		l.HighErr == nil && l.StatErr == nil && len(l.Unreadable) == 0 {
		s.plan = newPlan(l, used[0].top)
	}
	return l, err
}
