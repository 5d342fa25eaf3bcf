// The kernel's memory pressure sources, their portable parsers, and what
// the memory under pressure is made of; opening them is signal_linux.go.

package pressure

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/procfs"
	"github.com/memctl/memctl/internal/satmath"
)

// srcKind is how a source is opened and polled.
type srcKind int

const (
	srcPSI     srcKind = iota + 1 // a PSI file: write a trigger, poll POLLPRI
	srcV1Level                    // cgroup v1: cgroup.event_control and an eventfd
	srcSystemd                    // $MEMORY_PRESSURE_WATCH: a PSI file, FIFO or socket
	srcEvents                     // cgroup v2 memory.events, read-only, poll POLLPRI
)

// source is a kernel pressure source: the PSI file, v1 cgroup directory or
// systemd's path, what to write to it first, its name, and the cgroup
// directory it belongs to ("" host-wide and for systemd's).
type source struct {
	kind      srcKind
	path      string
	write     []byte
	name, dir string
	hostWide  bool // the system-wide PSI: the host's pressure
}

// psiTrigger returns the PSI trigger "some STALL_US WINDOW_US" with its
// terminating NUL (psi_write overwrites the last byte written with one).
func psiTrigger(stall, window time.Duration) []byte {
	return fmt.Appendf(nil, "some %d %d\x00", stall.Microseconds(), window.Microseconds())
}

// maxSystemdWrite is the most bytes of decoded $MEMORY_PRESSURE_WRITE memctl
// writes.
const maxSystemdWrite = 4096

// systemdEnv returns the source of systemd's memory pressure protocol
// (https://systemd.io/MEMORY_PRESSURE/) from $MEMORY_PRESSURE_WATCH and
// $MEMORY_PRESSURE_WRITE (base64, padded or not). ok is false when unset; off
// is true for "/dev/null". A relative path, or a write that is not base64 or
// decodes to over 4 KiB, is an error naming the variable.
func systemdEnv(getenv func(string) string) (s source, ok, off bool, err error) {
	path := strings.TrimSpace(getenv("MEMORY_PRESSURE_WATCH"))
	switch {
	case path == "":
		return source{}, false, false, nil
	case !strings.HasPrefix(path, "/"):
		return source{}, true, false, fmt.Errorf("pressure: $MEMORY_PRESSURE_WATCH=%q: want an absolute path", path)
	case filepath.Clean(path) == "/dev/null": // "//dev/null" and "/dev/null/" too, as systemd's path_equal
		return source{}, true, true, nil
	}
	s = source{kind: srcSystemd, path: path}
	w := strings.TrimSpace(getenv("MEMORY_PRESSURE_WRITE"))
	if w == "" {
		return s, true, false, nil
	}
	if len(w) > maxSystemdWrite*4/3+4 {
		return source{}, true, false, fmt.Errorf("pressure: $MEMORY_PRESSURE_WRITE is %d bytes of base64: over the %d bytes decoded that memctl writes (a PSI trigger is at most 32)", len(w), maxSystemdWrite)
	}
	b, err := base64.StdEncoding.DecodeString(w)
	if err != nil && !strings.HasSuffix(w, "=") {
		b, err = base64.RawStdEncoding.DecodeString(w) // padding left off
	}
	if err != nil {
		return source{}, true, false, fmt.Errorf("pressure: $MEMORY_PRESSURE_WRITE=%q: not base64: %w", w, err)
	}
	if len(b) > maxSystemdWrite {
		return source{}, true, false, fmt.Errorf("pressure: $MEMORY_PRESSURE_WRITE decodes to %d bytes: over the %d that memctl writes (a PSI trigger is at most 32)", len(b), maxSystemdWrite)
	}
	s.write = b
	return s, true, false, nil
}

// trigger is a PSI trigger: "some|full STALL_US WINDOW_US".
type trigger struct {
	full          bool
	stall, window int64 // µs
}

// parseTrigger parses a PSI trigger, a trailing NUL or newline allowed.
func parseTrigger(b []byte) (trigger, error) {
	f := strings.Split(string(bytes.TrimSuffix(bytes.TrimSuffix(b, []byte{0}), []byte{'\n'})), " ")
	if len(f) != 3 || (f[0] != "some" && f[0] != "full") {
		return trigger{}, errors.New("want three fields, the first some or full")
	}
	var us [2]int64
	for i, v := range f[1:] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || v[0] == '+' {
			return trigger{}, fmt.Errorf("%q is not a count of microseconds", v)
		}
		us[i] = n
	}
	return trigger{full: f[0] == "full", stall: us[0], window: us[1]}, nil
}

// systemdTrigger checks that b, the decoded $MEMORY_PRESSURE_WRITE for a
// PSI file, is a trigger with a window in [500000, 10000000] µs (psi.c) and a
// stall in (0, window], and returns it without leading zeros and ending in
// NUL.
func systemdTrigger(b []byte) ([]byte, error) {
	t, err := parseTrigger(b)
	switch {
	case err != nil:
	case t.window < 500_000 || t.window > 10_000_000:
		err = fmt.Errorf("window %d µs is not in [500000, 10000000]", t.window)
	case t.stall == 0 || t.stall > t.window:
		err = fmt.Errorf("stall %d µs is not in (0, %d]", t.stall, t.window)
	}
	if err != nil {
		return nil, fmt.Errorf("pressure: $MEMORY_PRESSURE_WRITE decodes to %q, not a PSI trigger (want \"some|full STALL_US WINDOW_US\"): %w", b, err)
	}
	return fmt.Appendf(nil, "%s %d %d\x00", strings.Fields(string(b))[0], t.stall, t.window), nil
}

// arm is a PSI trigger and its state's total stall (µs) when armed: the
// kernel may signal a trigger just armed for stall from before
// (psi_trigger_create).
type arm struct {
	trigger
	armed int64
}

// explains reports whether total, read after an event, grew by at least
// the threshold since arming; a total that went down explains it too.
func (a arm) explains(total int64) bool {
	return total < a.armed || total-a.armed >= a.stall
}

// parsePSITotals returns the "total=" figures (µs) of the "some" and
// "full" lines of a PSI file; -1 for a line absent or malformed.
func parsePSITotals(b []byte) (some, full int64) {
	some, full = -1, -1
	for _, line := range strings.Split(string(b), "\n") {
		kind, rest, _ := strings.Cut(line, " ")
		for _, f := range strings.Fields(rest) {
			v, ok := strings.CutPrefix(f, "total=")
			if !ok || (kind != "some" && kind != "full") {
				continue
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				n = -1
			}
			if kind == "some" {
				some = n
			} else {
				full = n
			}
		}
	}
	return some, full
}

// eventsGrowth returns how much the memory.events counters high, max, oom
// and oom_kill grew from a to b; an absent or decreasing one counts 0.
func eventsGrowth(a, b cgroupfs.Events) int64 {
	var d int64
	for _, p := range [...][2]int64{{a.High, b.High}, {a.Max, b.Max}, {a.OOM, b.OOM}, {a.OOMKill, b.OOMKill}} {
		if p[0] >= 0 && p[1] > p[0] {
			d = satmath.Add(d, p[1]-p[0])
		}
	}
	return d
}

// makeup is what the memory under pressure is made of, where the kernel
// says it, in bytes, -1 when unknown.
type makeup struct {
	Anon  int64  // memory.stat "anon" ("total_rss" in v1), or meminfo AnonPages
	Cache int64  // the file LRUs: "active_file" + "inactive_file", or meminfo's
	Own   int64  // this process's RssAnon, for the host's makeup only
	From  string // the file read
}

// known reports whether both Anon and Cache could be read.
func (m makeup) known() bool { return m.Anon >= 0 && m.Cache >= 0 }

// anonymous reports whether anonymous memory is known and more than the page
// cache, which the kernel reclaims first.
func (m makeup) anonymous() bool { return m.known() && m.Anon > m.Cache }

// unknownMakeup is the makeup when the file from could not be read.
func unknownMakeup(from string) makeup { return makeup{Anon: -1, Cache: -1, Own: -1, From: from} }

// makeupOfStat returns the makeup of a parsed memory.stat; the cache is
// unknown unless both file LRU lines are there.
func makeupOfStat(s cgroupfs.MemoryStat, from string) makeup {
	mk := makeup{Anon: s.Anon, Cache: -1, Own: -1, From: from}
	if s.ActiveFile >= 0 && s.InactiveFile >= 0 {
		mk.Cache = satmath.Add(s.ActiveFile, s.InactiveFile)
	}
	return mk
}

// hostMakeup reads the host's makeup from meminfo (/proc/meminfo) and this
// process's RssAnon from status (/proc/self/status; Own -1 when unread).
func hostMakeup(meminfo, status string) (makeup, error) {
	f, err := procfs.ReadFile(meminfo)
	if err != nil {
		return unknownMakeup(meminfo), err
	}
	var v [3]int64
	for i, k := range []string{"AnonPages", "Active(file)", "Inactive(file)"} {
		if v[i], err = f.Bytes(k); err != nil {
			return unknownMakeup(f.File), fmt.Errorf("pressure: %w", err)
		}
	}
	mk := makeup{Anon: v[0], Cache: satmath.Add(v[1], v[2]), Own: -1, From: f.File}
	if n, err := procfs.ReadBytes(status, "RssAnon"); err == nil {
		mk.Own = n
	}
	return mk, nil
}
