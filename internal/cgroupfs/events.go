package cgroupfs

import (
	"bytes"
	"fmt"
	"io"
	"iter"
	"os"
	"strconv"
	"strings"
)

// maxEventsFile bounds how much of a memory.events file is read: the kernel
// writes six short lines (under 200 bytes); anything larger is not one.
const maxEventsFile = 64 << 10

// Events holds the counters of a cgroup v2 memory.events file (or
// memory.events.local), as the kernel documents them in
// Documentation/admin-guide/cgroup-v2.rst ("memory.events"). Each is a
// count of events since the cgroup was created, never negative; a counter
// the file does not have (an older kernel: oom_kill appeared in Linux 4.13,
// oom_group_kill in 5.17) is -1, so that absent is never read as zero.
type Events struct {
	// Low counts reclaims of the cgroup while its usage was under
	// memory.low (its protection was not enough).
	Low int64
	// High counts the times usage went over memory.high and the cgroup's
	// processes were throttled and made to reclaim.
	High int64
	// Max counts the times usage was about to go over memory.max; when
	// direct reclaim fails to get it back under, the OOM killer runs.
	Max int64
	// OOM counts the times usage reached the limit and allocation failed
	// (the OOM killer was considered).
	OOM int64
	// OOMKill counts processes of the cgroup killed by any OOM killer.
	OOMKill int64
	// OOMGroupKill counts group OOM kills (memory.oom.group).
	OOMGroupKill int64
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
	switch key {
	case "low":
		return &e.Low
	case "high":
		return &e.High
	case "max":
		return &e.Max
	case "oom":
		return &e.OOM
	case "oom_kill":
		return &e.OOMKill
	case "oom_group_kill":
		return &e.OOMGroupKill
	}
	return nil
}

// ReadEvents reads and parses the memory.events file at path (for example
// "/sys/fs/cgroup/app.slice/memory.events"); see ParseEvents. The error
// names path. It only reads, so it is safe for concurrent use.
func ReadEvents(path string) (Events, error) {
	f, err := os.Open(path)
	if err != nil {
		return missingEvents(), fmt.Errorf("cgroupfs: %w", err)
	}
	defer f.Close()
	return ParseEvents(f, path)
}

// ParseEvents parses cgroup v2 memory.events lines ("key count", one space,
// decimal counts) from r; name is used in errors. Keys it does not know
// (a newer kernel's) are skipped; a known key without a count, with a
// count that is not plain decimal digits or overflows int64, or given twice
// is an error that names name and the line; so is a file with none of the
// known keys, or one over 64 KiB. On error every counter is -1.
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
