// Package procfs parses the "Key: value" files of Linux procfs
// (/proc/PID/status, /proc/PID/smaps_rollup, /proc/meminfo) that memctl reads.
//
// ReadFileIn reads another process's file through a safefs.Dir; excerpts in
// errors are quoted with safefs.Quote. Every error names its file, and
// malformed input is an error, never a guess.
package procfs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/memctl/memctl/internal/fastread"
	"github.com/memctl/memctl/internal/safefs"
)

// ErrMissing is matched by the error of a lookup whose key is not in the
// file (THP_enabled before Linux 5.0, AnonHugePages without THP).
var ErrMissing = errors.New("procfs: key not present")

// Fields holds the fields of one "Key: value" file. The zero value is empty.
// A Fields is safe for concurrent reads.
type Fields struct {
	// File is the path (or name) the fields were read from; it prefixes errors.
	File   string
	values map[string]string
}

// ReadFile reads and parses the "Key: value" file at path; the error names path.
func ReadFile(path string) (Fields, error) {
	f, err := os.Open(path)
	if err != nil {
		return Fields{File: path}, fmt.Errorf("procfs: %w", err)
	}
	defer f.Close()
	return Parse(f, path)
}

// ReadFileIn reads and parses the "Key: value" file name of d (a /proc/PID
// Dir), at most safefs.MaxProcFile bytes; errors as safefs.Dir.ReadFile's.
func ReadFileIn(d *safefs.Dir, name string) (Fields, error) {
	path := d.Name() + "/" + name
	b, err := d.ReadFile(name, safefs.MaxProcFile)
	if err != nil {
		return Fields{File: path}, fmt.Errorf("procfs: %w", err)
	}
	return Parse(bytes.NewReader(b), path)
}

// Parse parses "Key: value" lines from r. name is used in errors. A first
// line that is an smaps_rollup header ("... [rollup]") is skipped; any other
// line without a "Key:" prefix is an error naming name and the line number.
func Parse(r io.Reader, name string) (Fields, error) {
	fs := Fields{File: name, values: make(map[string]string)}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			continue
		}
		key, val, ok := strings.Cut(line, ":")
		if !ok || key == "" || strings.ContainsAny(key, " \t") {
			if n == 1 && strings.HasSuffix(strings.TrimSpace(line), "[rollup]") {
				continue
			}
			return Fields{File: name}, fmt.Errorf("procfs: %s: line %d: malformed, want \"Key: value\": %s", name, n, safefs.Quote(line))
		}
		fs.values[key] = strings.TrimSpace(val)
	}
	if err := sc.Err(); err != nil {
		return Fields{File: name}, fmt.Errorf("procfs: %s: %w", name, err)
	}
	if len(fs.values) == 0 {
		return Fields{File: name}, fmt.Errorf("procfs: %s: no fields", name)
	}
	return fs, nil
}

// String returns the raw value of key and whether it is present.
func (f Fields) String(key string) (string, bool) {
	v, ok := f.values[key]
	return v, ok
}

// Int returns the value of key, decimal digits (THP_enabled, Threads), as
// an int64 ≥ 0. The error matches ErrMissing when key is absent, and names
// the file when the value is not digits only (no sign) or overflows.
func (f Fields) Int(key string) (int64, error) {
	v, ok := f.values[key]
	if !ok {
		return 0, fmt.Errorf("%s: %s: %w", f.File, key, ErrMissing)
	}
	n, ok := parseDigits(v)
	if !ok {
		return 0, fmt.Errorf("procfs: %s: %s: malformed integer %s, want decimal digits", f.File, key, safefs.Quote(v))
	}
	return n, nil
}

// parseDigits parses s, decimal digits only, as an int64; ok is false
// otherwise or on overflow.
func parseDigits[T string | []byte](s T) (n int64, ok bool) {
	for i := 0; i < len(s); i++ {
		d := int64(s[i] - '0')
		if s[i] < '0' || s[i] > '9' || n > (math.MaxInt64-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	return n, len(s) > 0
}

// Bytes returns the value of key, "N kB" (KiB), in bytes. The error
// matches ErrMissing when key is absent, and names the file when N is not
// digits only (no sign) or the bytes overflow int64.
func (f Fields) Bytes(key string) (int64, error) {
	v, ok := f.values[key]
	if !ok {
		return 0, fmt.Errorf("%s: %s: %w", f.File, key, ErrMissing)
	}
	num, unit, _ := strings.Cut(v, " ")
	unit = strings.TrimSpace(unit)
	if unit != "kB" {
		return 0, fmt.Errorf("procfs: %s: %s: want \"N kB\", got %s", f.File, key, safefs.Quote(v))
	}
	kib, ok := parseDigits(num)
	if !ok || kib > math.MaxInt64/1024 {
		return 0, fmt.Errorf("procfs: %s: %s: malformed size %s, want decimal digits and \" kB\"", f.File, key, safefs.Quote(v))
	}
	return kib * 1024, nil
}

// ReadBytes reads one "N kB" field of the file at path, in bytes.
func ReadBytes(path, key string) (int64, error) {
	f, err := ReadFile(path)
	if err != nil {
		return 0, err
	}
	return f.Bytes(key)
}

// RSS returns the resident set size (VmRSS in /proc/PID/status) of the process
// pid in bytes; pid 0 means this process. Source: proc(5).
func RSS(pid int) (int64, error) {
	return ReadBytes(StatusPath(pid), "VmRSS")
}

// Held returns the resident memory of process pid the kernel cannot
// reclaim without swap, in bytes: RssAnon + RssShmem of /proc/PID/status
// (proc(5)); VmRSS before Linux 4.5, which has no RssAnon.
func Held(pid int) (int64, error) {
	f, err := ReadFile(StatusPath(pid))
	if err != nil {
		return 0, err
	}
	anon, err := f.Bytes("RssAnon")
	if errors.Is(err, ErrMissing) {
		return f.Bytes("VmRSS")
	}
	if err != nil {
		return 0, err
	}
	shmem, err := f.Bytes("RssShmem")
	if err != nil && !errors.Is(err, ErrMissing) {
		return 0, err
	}
	return anon + shmem, nil
}

// StatusPath returns Path(pid, "status").
func StatusPath(pid int) string { return Path(pid, "status") }

// Path returns the path of file under /proc/self (pid 0) or /proc/PID.
func Path(pid int, file string) string {
	if pid == 0 {
		return "/proc/self/" + file
	}
	return "/proc/" + strconv.Itoa(pid) + "/" + file
}

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

// AnonHugePages returns the bytes of anonymous memory of the process pid
// (0: the calling process) backed by PMD-sized transparent huge pages:
// AnonHugePages in /proc/PID/smaps_rollup (proc(5), Linux 4.14 and later).
// Another process's needs ptrace read access; each call walks the mappings.
func AnonHugePages(pid int) (int64, error) {
	return ReadBytes(Path(pid, "smaps_rollup"), "AnonHugePages")
}
