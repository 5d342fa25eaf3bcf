package procfs

import (
	"bytes"
	"math"

	"github.com/memctl/memctl/internal/fastread"
	"github.com/memctl/memctl/internal/safefs"
)

// SelfHeld reads Held(0) again and again without allocating:
// /proc/self/status kept open, read into a buffer it keeps. A file it does
// not read plainly (no RssAnon, another unit, a read error) is read again
// by Held(0), whose value and error are returned. The zero value is ready;
// a SelfHeld is not safe for concurrent use.
type SelfHeld struct {
	file fastread.File
	buf  []byte
}

// Close closes /proc/self/status; a later Held opens it again.
func (s *SelfHeld) Close() { s.file.Close() }

// Held returns what the caller holds that the kernel cannot reclaim, in
// bytes, as Held(0).
func (s *SelfHeld) Held() (int64, error) {
	if s.file.String() == "" {
		s.file, _ = fastread.New(StatusPath(0)) // a fixed name: no error
	}
	var err error
	s.buf, err = s.file.Read(s.buf, safefs.MaxProcFile)
	anon, okAnon := kibField(s.buf, "RssAnon:")
	shmem, okShmem := kibField(s.buf, "RssShmem:")
	if err != nil || !okAnon || !okShmem {
		return Held(0)
	}
	return anon + shmem, nil
}

// kibField returns the bytes of the first line of b that starts with key
// and is then blanks, decimal digits and " kB"; ok is false otherwise.
func kibField(b []byte, key string) (int64, bool) {
	for rest := b; len(rest) > 0; {
		var line []byte
		line, rest, _ = bytes.Cut(rest, []byte("\n"))
		if v, found := bytes.CutPrefix(line, []byte(key)); found {
			v, found = bytes.CutSuffix(bytes.TrimLeft(v, " \t"), []byte(" kB"))
			if n, ok := parseDigits(v); found && ok && n <= math.MaxInt64/1024 {
				return n * 1024, true
			}
			return 0, false
		}
	}
	return 0, false
}
