package pressure

import (
	"encoding/base64"
	"fmt"
	"strings"
	"time"
)

// sourceKind is how a source is opened and polled.
type sourceKind int

const (
	srcPSI     sourceKind = iota + 1 // write a trigger, poll POLLPRI
	srcV1Level                       // cgroup.event_control + eventfd
	srcSystemd                       // $MEMORY_PRESSURE_WATCH
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
// "/dev/null" means the service manager turned watching off: off is true.
// A path that is not absolute or a write that is not base64 is an error.
func systemdSource(getenv func(string) string) (s source, ok, off bool, err error) {
	path := strings.TrimSpace(getenv("MEMORY_PRESSURE_WATCH"))
	if path == "" {
		return source{}, false, false, nil
	}
	if path == "/dev/null" {
		return source{}, true, true, nil
	}
	if !strings.HasPrefix(path, "/") {
		return source{}, true, false, fmt.Errorf("pressure: $MEMORY_PRESSURE_WATCH=%q: want an absolute path", path)
	}
	s = source{kind: srcSystemd, path: path, name: "systemd " + path}
	if w := strings.TrimSpace(getenv("MEMORY_PRESSURE_WRITE")); w != "" {
		b, err := base64.StdEncoding.DecodeString(w)
		if err != nil {
			return source{}, true, false, fmt.Errorf("pressure: $MEMORY_PRESSURE_WRITE=%q: not base64: %w", w, err)
		}
		s.write = b
	}
	return s, true, false, nil
}
