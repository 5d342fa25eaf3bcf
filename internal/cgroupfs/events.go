package cgroupfs

import (
	"bytes"
	"fmt"
	"io"
	"iter"
	"os"
	"slices"
	"strconv"
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
	b, err := io.ReadAll(io.LimitReader(r, maxEventsFile+1))
	if err != nil {
		return missingEvents(), fmt.Errorf("cgroupfs: %s: %w", name, err)
	}
	if len(b) > maxEventsFile {
		return missingEvents(), fmt.Errorf("cgroupfs: %s: over %d bytes, not a memory.events file", name, maxEventsFile)
	}
	e := missingEvents()
	found := 0
	sc := lines(bytes.NewReader(b))
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		if line == "" {
			continue
		}
		key, val, ok := strings.Cut(line, " ")
		p := e.field(key)
		if p == nil {
			if !ok || key == "" {
				return missingEvents(), fmt.Errorf("cgroupfs: %s: line %d: malformed, want \"key count\": %q", name, n, line)
			}
			continue
		}
		if !ok || !isDecimal(val) {
			return missingEvents(), fmt.Errorf("cgroupfs: %s: line %d: malformed count, want decimal digits: %q", name, n, line)
		}
		v, err := strconv.ParseInt(val, 10, 64)
		if err != nil {
			return missingEvents(), fmt.Errorf("cgroupfs: %s: line %d: count out of range: %q", name, n, line)
		}
		if *p != -1 {
			return missingEvents(), fmt.Errorf("cgroupfs: %s: line %d: %s given twice", name, n, key)
		}
		*p = v
		found++
	}
	if err := sc.Err(); err != nil {
		return missingEvents(), fmt.Errorf("cgroupfs: %s: %w", name, err)
	}
	if found == 0 {
		return missingEvents(), fmt.Errorf("cgroupfs: %s: none of %s: not a memory.events file", name, strings.Join(eventKeys[:], ", "))
	}
	return e, nil
}

func missingEvents() Events { return Events{-1, -1, -1, -1, -1, -1} }
