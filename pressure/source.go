package pressure

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// sourceKind is how a source is opened and polled.
type sourceKind int

const (
	srcPSI     sourceKind = iota + 1 // write a trigger, poll POLLPRI
	srcV1Level                       // cgroup.event_control + eventfd
	srcSystemd                       // $MEMORY_PRESSURE_WATCH
	srcEvents                        // cgroup v2 memory.events, read-only, poll POLLPRI
)

// source is a kernel pressure source to open.
type source struct {
	kind sourceKind
	// path is the PSI file, the v1 cgroup directory, or the systemd path.
	path string
	// write is what to write to path after opening it (PSI trigger,
	// systemd's decoded $MEMORY_PRESSURE_WRITE); empty: nothing.
	write []byte
	name  string
	// dir is the cgroup directory the source belongs to ("" for the
	// host-wide PSI and systemd's); hostWide marks the host-wide PSI.
	dir      string
	hostWide bool
}

// psiTrigger returns the PSI trigger "some STALL_US WINDOW_US" with its
// terminating NUL (Documentation/accounting/psi.rst, "Monitoring for
// pressure thresholds": the example writes strlen(trig) + 1 bytes). The
// NUL matters: the kernel overwrites the last byte written with one
// (psi_write), so without it the window loses its last digit, and
// "some 200000 2000000" is refused with EINVAL (checked here on 6.18).
func psiTrigger(stall, window time.Duration) []byte {
	return fmt.Appendf(nil, "some %d %d\x00", stall.Microseconds(), window.Microseconds())
}

// systemdSource returns the source systemd's memory pressure protocol
// names in the environment (https://systemd.io/MEMORY_PRESSURE/):
// $MEMORY_PRESSURE_WATCH is the path to open (a PSI file, a FIFO or an
// AF_UNIX socket), $MEMORY_PRESSURE_WRITE, base64, what to write to it
// first. ok is false when the variable is unset. A watch path of
// "/dev/null" (in any spelling filepath.Clean makes it) means the service
// manager turned watching off: off is true. A path that is not absolute,
// or a write that is not base64 (padded or not) or decodes to over 4 KiB,
// is an error that names the variable.
func systemdSource(getenv func(string) string) (s source, ok, off bool, err error) {
	path := strings.TrimSpace(getenv("MEMORY_PRESSURE_WATCH"))
	if path == "" {
		return source{}, false, false, nil
	}
	if !strings.HasPrefix(path, "/") {
		return source{}, true, false, fmt.Errorf("pressure: $MEMORY_PRESSURE_WATCH=%q: want an absolute path", path)
	}
	if filepath.Clean(path) == "/dev/null" { // "//dev/null" and "/dev/null/" too, as systemd's path_equal
		return source{}, true, true, nil
	}
	s = source{kind: srcSystemd, path: path, name: "systemd " + path}
	if w := strings.TrimSpace(getenv("MEMORY_PRESSURE_WRITE")); w != "" {
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
	}
	return s, true, false, nil
}

// maxSystemdWrite is the most bytes of decoded $MEMORY_PRESSURE_WRITE
// memctl writes: the kernel reads at most 32 bytes of a PSI trigger
// (kernel/sched/psi.c psi_write), and a FIFO or socket of the service
// manager needs no more than a line.
const maxSystemdWrite = 4096

// The kernel's bounds of a PSI trigger's window (kernel/sched/psi.c
// WINDOW_MIN_US, WINDOW_MAX_US).
const (
	psiWindowMinUS = 500_000
	psiWindowMaxUS = 10_000_000
)

// systemdTrigger checks that b, the decoded $MEMORY_PRESSURE_WRITE for a
// PSI file, is a PSI trigger ("some|full STALL_US WINDOW_US", the window in
// [500000, 10000000] µs, the stall in (0, window]) and returns it with its
// terminating NUL, appended when b lacks it. systemd writes the value as
// given (https://systemd.io/MEMORY_PRESSURE/), and the kernel overwrites
// the last byte written with NUL (psi_write): a value written by hand
// without one, "some 200000 2000000", is armed as "some 200000 200000" (a
// 100% stall threshold) by a writer with CAP_SYS_RESOURCE and refused with
// EINVAL by others. A trailing newline (echo ... | base64) is dropped
// too, and the numbers are written in their shortest form (leading zeros
// would push the window past the 32 bytes the kernel reads). The error
// names the variable and quotes the value.
func systemdTrigger(b []byte) ([]byte, error) {
	t := bytes.TrimSuffix(bytes.TrimSuffix(b, []byte{0}), []byte{'\n'}) // echo | base64 ends in a newline
	bad := func(why string) error {
		return fmt.Errorf("pressure: $MEMORY_PRESSURE_WRITE decodes to %q, not a PSI trigger (want \"some|full STALL_US WINDOW_US\"): %s", b, why)
	}
	f := strings.Split(string(t), " ")
	if len(f) != 3 || (f[0] != "some" && f[0] != "full") {
		return nil, bad("want three fields, the first some or full")
	}
	var us [2]int64
	for i, v := range f[1:] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || v[0] == '+' {
			return nil, bad(fmt.Sprintf("%q is not a count of microseconds", v))
		}
		us[i] = n
	}
	switch stall, window := us[0], us[1]; {
	case window < psiWindowMinUS || window > psiWindowMaxUS:
		return nil, bad(fmt.Sprintf("window %d µs is not in [%d, %d]", window, psiWindowMinUS, psiWindowMaxUS))
	case stall == 0 || stall > window:
		return nil, bad(fmt.Sprintf("stall %d µs is not in (0, %d]", stall, window))
	}
	// Written as the kernel reads it, without leading zeros: psi_write
	// copies at most 32 bytes and overwrites the last with NUL, so
	// "some 000000000000200000 10000000" would be armed as a 1 s window.
	return fmt.Appendf(nil, "%s %d %d\x00", f[0], us[0], us[1]), nil
}
