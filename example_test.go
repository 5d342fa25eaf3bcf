package memctl_test

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/memctl/memctl"
	"github.com/memctl/memctl/trim"
)

// exampleLogger prints slog records on standard output and keeps only the
// attributes that are the same on every machine: the real startup line
// also has the THP state and policy (except-advised from Linux 6.18,
// disable before), GOMEMLIMIT and where it came from, and the C heap.
func exampleLogger() *slog.Logger {
	keep := map[string]bool{slog.LevelKey: true, slog.MessageKey: true, "trim_delay": true, "auto_burst": true}
	return slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if !keep[a.Key] {
				return slog.Attr{}
			}
			return a
		},
	}))
}

// work stands for a burst of work: it allocates n bytes that are garbage
// when it returns.
func work(n int) int {
	chunks := make([][]byte, 0, n>>20)
	for range n >> 20 {
		chunks = append(chunks, make([]byte, 1<<20))
	}
	return len(chunks)
}

// waitTrims waits, for at most 10 s, until ctl has run n trims.
func waitTrims(ctl *memctl.Controller, n int64) int64 {
	for deadline := time.Now().Add(10 * time.Second); ctl.Stats().Trim.Trims < n && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	return ctl.Stats().Trim.Trims
}

// Start at the top of main: THP off for the process except where it asks
// for huge pages (and its children, which inherit the flag), GOMEMLIMIT from
// the cgroup limit, and a trimmer that finds bursts itself. Start logs its decisions itself (one INFO
// line, one WARN per part it skipped), so main need not log its error.
func ExampleStart() {
	ctl, _ := memctl.Start(memctl.WithLogger(exampleLogger()))
	defer ctl.Close()

	r := ctl.Report()
	fmt.Println("trim delay:", r.TrimDelay)
	fmt.Println("burst detection:", r.AutoBurst)
	// Output:
	// level=INFO msg="memctl started" trim_delay=2s auto_burst=on
	// trim delay: 2s
	// burst detection: true
}

// AfterBurst where a burst of work ends: the trim runs once, the trim delay
// after the last call. The short delay and a negative MinRelease (trim even
// when little would be released) make the example quick and certain; the burst
// detector, which would see this 64 MiB burst at GC end and trim it on its
// own too, is off so that the count is exact.
func ExampleAfterBurst() {
	ctl, _ := memctl.Start(memctl.WithLogger(slog.New(slog.DiscardHandler)),
		memctl.WithTrimDelay(10*time.Millisecond),
		memctl.WithTrim(trim.Config{MinRelease: -1}),
		memctl.WithAutoBurst(trim.AutoBurstConfig{Off: true}))
	defer ctl.Close()

	work(64 << 20)
	memctl.AfterBurst() // three calls in a row give one trim
	memctl.AfterBurst()
	memctl.AfterBurst()

	fmt.Println("trims:", waitTrims(ctl, 1))
	// Output:
	// trims: 1
}

// Begin marks a burst in flight: no trim runs while one is, however long
// it lasts; the returned func ends it and counts as AfterBurst.
func ExampleBegin() {
	ctl, _ := memctl.Start(memctl.WithLogger(slog.New(slog.DiscardHandler)),
		memctl.WithTrimDelay(10*time.Millisecond),
		memctl.WithTrim(trim.Config{MinRelease: -1}))
	defer ctl.Close()

	end := memctl.Begin()
	memctl.AfterBurst()               // another burst ended meanwhile
	time.Sleep(50 * time.Millisecond) // five trim delays
	fmt.Println("trims while in flight:", ctl.Stats().Trim.Trims)
	end()
	fmt.Println("trims after end:", waitTrims(ctl, 1))
	// Output:
	// trims while in flight: 0
	// trims after end: 1
}
