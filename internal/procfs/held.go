package procfs

import (
	"bytes"

	"github.com/memctl/memctl/internal/fastread"
	"github.com/memctl/memctl/internal/safefs"
)

// SelfHeld reads Held(0) again and again: /proc/self/status, kept open,
// into a buffer it keeps, RssAnon and RssShmem found by a scan, allocating
// nothing. A
// file it does not read plainly (no RssAnon, another unit, a read error)
// is read again by Held(0), whose value and error are returned. The zero
// value is ready; a SelfHeld is not safe for concurrent use.
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
		f, err := fastread.New(StatusPath(0))
		if err != nil {
			return Held(0)
		}
		s.file = f
	}
	var err error
	s.buf, err = s.file.Read(s.buf, safefs.MaxProcFile)
	if err != nil {
		return Held(0)
	}
	anon, ok := kibField(s.buf, "RssAnon:")
	if !ok {
		return Held(0)
	}
	shmem, ok := kibField(s.buf, "RssShmem:")
	if !ok {
		return Held(0)
	}
	return anon + shmem, nil
}

// kibField returns the bytes of the first line of b that starts with key
// and is then blanks, decimal digits and " kB"; ok is false otherwise.
func kibField(b []byte, key string) (int64, bool) {
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		v, found := bytes.CutPrefix(line, []byte(key))
		if !found {
			continue
		}
		v, found = bytes.CutSuffix(bytes.TrimLeft(v, " \t"), []byte(" kB"))
		if !found || len(v) == 0 || len(v) > 15 { // 15 digits of KiB fit int64 bytes
			return 0, false
		}
		var n int64
		for _, c := range v {
			if c < '0' || c > '9' {
				return 0, false
			}
			n = n*10 + int64(c-'0')
		}
		return n * 1024, true
	}
	return 0, false
}
