package memctl

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
)

// AfterBurst calls AfterBurst on the live controller of the latest Start;
// with none it is a wiring mistake (see the package doc).
func AfterBurst() {
	if c := current.Load(); c != nil {
		c.AfterBurst()
		return
	}
	noController("AfterBurst")
}

// Begin calls Begin on the live controller of the latest Start; with none it
// is a wiring mistake and only counts.
func Begin() (end func()) {
	c := current.Load()
	if c == nil {
		noController("Begin")
	}
	return c.Begin()
}

// CurrentStats returns the Stats of the live controller of the latest Start,
// or with none the counters kept without one.
func CurrentStats() Stats { return current.Load().Stats() }

var (
	current atomic.Pointer[Controller] // the last of live (started, not closed)
	liveMu  sync.Mutex
	live    []*Controller

	misuse       atomic.Int64
	warnedNoCtl  atomic.Bool
	warnedSecond atomic.Bool
)

// register makes c the live controller, warning once if another is live.
func register(c *Controller, l *slog.Logger) {
	liveMu.Lock()
	var prev *Controller
	if n := len(live); n > 0 {
		prev = live[n-1]
	}
	live = append(live, c)
	current.Store(c)
	liveMu.Unlock()
	if prev == nil {
		return
	}
	misuse.Add(1)
	if !warnedSecond.Swap(true) {
		l.Warn("memctl: Start called while an earlier controller is live (a second Start, or Start beside the auto package); "+
			"the newest now serves memctl.AfterBurst and memctl.Begin, and both run until their Close",
			"earlier_start", prev.startedBy, "this_start", c.startedBy)
	}
}

// unregister hands the package-level functions to the latest live controller.
func unregister(c *Controller) {
	liveMu.Lock()
	defer liveMu.Unlock()
	if i := slices.Index(live, c); i >= 0 {
		live = slices.Delete(live, i, i+1)
	}
	current.Store(nil)
	if n := len(live); n > 0 {
		current.Store(live[n-1])
	}
}

func noController(fn string) {
	misuse.Add(1)
	if !warnedNoCtl.Load() && !warnedNoCtl.Swap(true) {
		slog.Default().Warn("memctl: " + fn + " called with no live controller: nothing will be trimmed; " +
			"call memctl.Start at the top of main (or import github.com/memctl/memctl/auto) and Close it at exit")
	}
}

// caller names the function skip frames up: "main.main (main.go:12)".
func caller(skip int) string {
	pc, file, line, ok := runtime.Caller(skip)
	if !ok {
		return "unknown"
	}
	name := "unknown"
	if f := runtime.FuncForPC(pc); f != nil {
		name = f.Name()
	}
	return fmt.Sprintf("%s (%s:%d)", name, filepath.Base(file), line)
}
