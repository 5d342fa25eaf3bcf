package cgroupfs

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/memctl/memctl/internal/safefs"
)

// ErrNoThrottleCounter is matched by the error of CPUStatFile when the
// process has no CPU cgroup here, and of ParseThrottled when a cpu.stat
// holds no throttled time (v2 without the cpu controller).
var ErrNoThrottleCounter = errors.New("cgroupfs: no CPU throttling counter")

// CPUStatFile returns the cpu.stat file of the process's CPU cgroup
// (arguments as for Read): v1's when listed and mounted, else v2's; with
// neither the error matches ErrNoThrottleCounter. Safe for concurrent use.
func CPUStatFile(cgroupFile, mountinfoFile, root string) (string, error) {
	s, err := openSource(cgroupFile, mountinfoFile, root)
	if err != nil {
		return "", err
	}
	defer s.close()
	v1, v2, err := s.parseCgroupFile(cgroupFile, "cpu")
	if err != nil {
		return "", err
	}
	mounts, err := s.parseMountinfoFile(mountinfoFile)
	if err != nil {
		return "", err
	}
	var why []string
	if v1 != "" {
		dir, _, err := cgroupDir(mounts, v1, func(m mount) bool { return isV1(m, "cpu") }, root)
		if err == nil {
			return filepath.Join(dir, "cpu.stat"), nil
		}
		why = append(why, "v1 cpu: "+err.Error())
	}
	if v2 != "" {
		dir, _, err := cgroupDir(mounts, v2, isV2, root)
		if err == nil {
			return filepath.Join(dir, "cpu.stat"), nil
		}
		why = append(why, "v2: "+err.Error())
	}
	if len(why) == 0 {
		why = append(why, cgroupFile+" lists neither the cpu controller nor a cgroup v2 hierarchy")
	}
	return "", fmt.Errorf("%w: %s", ErrNoThrottleCounter, strings.Join(why, "; "))
}

// ReadThrottled reads and parses cpu.stat at path. Safe for concurrent use.
func ReadThrottled(path string) (time.Duration, error) {
	b, err := readIn("/", path)
	if err != nil {
		return 0, err
	}
	return ParseThrottled(bytes.NewReader(b), path)
}

// ParseThrottled parses a cpu.stat file ("key value" lines) and returns
// the time the CFS bandwidth controller held the cgroup throttled, summed
// over CPUs: v1 throttled_time (ns, sched-bwc.rst) or v2 throttled_usec.
// Neither gives ErrNoThrottleCounter; a malformed, negative or overflowing
// value an error quoting the line.
func ParseThrottled(r io.Reader, name string) (time.Duration, error) {
	sc := lines(r)
	n := 0
	for sc.Scan() {
		n++
		if sc.Text() == "" {
			continue
		}
		key, val, ok := strings.Cut(sc.Text(), " ")
		if !ok || key == "" {
			return 0, fmt.Errorf("cgroupfs: %s: line %d: malformed, want \"key value\": %s", name, n, safefs.Quote(sc.Text()))
		}
		var unit time.Duration
		switch key {
		case "throttled_time":
			unit = time.Nanosecond
		case "throttled_usec":
			unit = time.Microsecond
		default:
			continue
		}
		v, err := strconv.ParseInt(val, 10, 64)
		if err != nil || v < 0 || v > int64(1<<63-1)/int64(unit) {
			return 0, fmt.Errorf("cgroupfs: %s: line %d: %s is not a count of %v that fits in int64 nanoseconds: %s", name, n, key, unit, safefs.Quote(sc.Text()))
		}
		return time.Duration(v) * unit, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("cgroupfs: %s: %w", name, err)
	}
	return 0, fmt.Errorf("%w: %s has neither throttled_time (v1) nor throttled_usec (v2; the cpu controller is not enabled)", ErrNoThrottleCounter, name)
}
