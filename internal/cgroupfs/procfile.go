package cgroupfs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"

	"github.com/memctl/memctl/internal/safefs"
)

// parseCgroupFile reads a /proc/PID/cgroup file ("ID:controllers:path"
// lines, cgroups(7)) and returns the cgroup of the v1 controller ctrl and
// the v2 cgroup ("0::path"), each "" when absent.
func (s *source) parseCgroupFile(name, ctrl string) (v1, v2 string, err error) {
	b, err := s.proc.ReadFile(s.cgroupRel, safefs.MaxProcFile)
	if errors.Is(err, fs.ErrNotExist) {
		// A kernel without cgroups has no /proc/PID/cgroup.
		return "", "", fmt.Errorf("%w: %w", ErrNoCgroup, err)
	}
	if err != nil {
		return "", "", fmt.Errorf("cgroupfs: %w", err)
	}
	return parseCgroupFor(bytes.NewReader(b), name, ctrl)
}

// parseCgroupFor parses a /proc/PID/cgroup file. A second line for one
// hierarchy, a path with "." or ".." after a name, is malformed.
func parseCgroupFor(r io.Reader, name, ctrl string) (v1, v2 string, err error) {
	sc := lines(r)
	n := 0
	seenV1, seenV2 := false, false
	for sc.Scan() {
		n++
		line := sc.Text()
		if line == "" {
			continue
		}
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !isDecimal(parts[0]) || !strings.HasPrefix(parts[2], "/") {
			return "", "", fmt.Errorf("cgroupfs: %s: line %d: malformed, want ID:controllers:/path: %s", name, n, safefs.Quote(line))
		}
		if !cleanPath(parts[2], true) {
			return "", "", fmt.Errorf("cgroupfs: %s: line %d: malformed cgroup path, \".\" or \"..\" after a name: %s", name, n, safefs.Quote(line))
		}
		if parts[0] == "0" && parts[1] == "" {
			if seenV2 {
				return "", "", fmt.Errorf("cgroupfs: %s: line %d: malformed, a second cgroup v2 line (the kernel writes one line a hierarchy): %s", name, n, safefs.Quote(line))
			}
			v2, seenV2 = parts[2], true
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c != ctrl {
				continue
			}
			if seenV1 {
				return "", "", fmt.Errorf("cgroupfs: %s: line %d: malformed, a second line for the %s controller (the kernel writes one line a hierarchy): %s", name, n, ctrl, safefs.Quote(line))
			}
			v1, seenV1 = parts[2], true
		}
	}
	if err := sc.Err(); err != nil {
		return "", "", fmt.Errorf("cgroupfs: %s: %w", name, err)
	}
	if n == 0 {
		return "", "", fmt.Errorf("cgroupfs: %s: empty", name)
	}
	return v1, v2, nil
}

// lines splits r at '\n' alone: a '\r' may end a cgroup's (unescaped) name.
func lines(r io.Reader) *bufio.Scanner {
	sc := bufio.NewScanner(r)
	sc.Split(func(data []byte, atEOF bool) (int, []byte, error) {
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			return i + 1, data[:i], nil
		}
		if atEOF && len(data) > 0 {
			return len(data), data, nil
		}
		return 0, nil, nil
	})
	return sc
}

func isDecimal[T string | []byte](s T) bool {
	if len(s) == 0 {
		return false
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
