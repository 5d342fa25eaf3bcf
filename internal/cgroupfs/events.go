package cgroupfs

import (
	"fmt"
	"io"
	"iter"
	"os"
	"slices"
	"strings"
)

// maxEventsFile bounds a memory.events file (six short lines).
const maxEventsFile = 64 << 10

// Events holds the counters of a cgroup v2 memory.events file
// (cgroup-v2.rst "memory.events"): counts since the cgroup was created; a
// counter the file lacks (oom_kill before Linux 4.13, oom_group_kill
// before 5.17) is -1, never read as zero.
type Events struct {
	Low          int64 // reclaims while under memory.low
	High         int64 // times over memory.high, throttled
	Max          int64 // times about to go over memory.max
	OOM          int64 // times the limit was reached and allocation failed
	OOMKill      int64 // processes killed by an OOM killer
	OOMGroupKill int64 // group OOM kills (memory.oom.group)
}

// eventKeys are the counters Events holds, in the kernel's order.
var eventKeys = [...]string{"low", "high", "max", "oom", "oom_kill", "oom_group_kill"}

// All yields each counter under its memory.events key, in the kernel's
// order; an absent counter yields -1.
func (e Events) All() iter.Seq2[string, int64] {
	return func(yield func(string, int64) bool) {
		for _, k := range eventKeys {
			if !yield(k, *e.field(k)) {
				return
			}
		}
	}
}

func (e *Events) field(key string) *int64 {
	if i := slices.Index(eventKeys[:], key); i >= 0 {
		return [...]*int64{&e.Low, &e.High, &e.Max, &e.OOM, &e.OOMKill, &e.OOMGroupKill}[i]
	}
	return nil
}

// ReadEvents reads and parses memory.events at path. Safe for concurrent use.
func ReadEvents(path string) (Events, error) {
	f, err := os.Open(path)
	if err != nil {
		return missingEvents(), fmt.Errorf("cgroupfs: %w", err)
	}
	defer f.Close()
	return ParseEvents(f, path)
}

// ParseEvents parses memory.events lines ("key count") from r; name is
// used in errors. Unknown keys are skipped; a bad or repeated count, no
// known key, or over 64 KiB is an error naming the line, all counters -1.
func ParseEvents(r io.Reader, name string) (Events, error) {
	fail := func(format string, args ...any) (Events, error) {
		return missingEvents(), fmt.Errorf("cgroupfs: %s: "+format, append([]any{name}, args...)...)
	}
	b, err := io.ReadAll(io.LimitReader(r, maxEventsFile+1))
	switch {
	case err != nil:
		return fail("%w", err)
	case len(b) > maxEventsFile:
		return fail("over %d bytes, not a memory.events file", maxEventsFile)
	}
	e, found := missingEvents(), 0
	for n, rest := 1, b; len(rest) > 0; n++ {
		var line []byte
		line, rest = nextLine(rest)
		key, val, ok := strings.Cut(string(line), " ")
		p := e.field(key)
		switch {
		case len(line) == 0:
			continue
		case p == nil && (!ok || key == ""):
			return fail("line %d: malformed, want \"key count\": %q", n, line)
		case p == nil:
			continue
		case !ok || !isDecimal(val):
			return fail("line %d: malformed count, want decimal digits: %q", n, line)
		}
		v, ok := parseDecimal([]byte(val))
		switch {
		case !ok:
			return fail("line %d: count out of range: %q", n, line)
		case *p != -1:
			return fail("line %d: %s given twice", n, key)
		}
		*p, found = v, found+1
	}
	if found == 0 {
		return fail("none of %s: not a memory.events file", strings.Join(eventKeys[:], ", "))
	}
	return e, nil
}

func missingEvents() Events { return Events{-1, -1, -1, -1, -1, -1} }
