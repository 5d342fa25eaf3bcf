// Package trim returns freed memory to the OS a few seconds after a burst of
// work ends.
//
// A Go program that has just served a burst keeps the burst's pages resident
// for minutes: the garbage is collected only at the next GC (an idle program
// gets a forced GC every 2 minutes), and the background scavenger returns
// free pages slowly. Measured in this repository (Go 1.26, Linux): a child
// that holds 20 MiB live and drops a 256 MiB burst still has more than
// 200 MiB of RSS 3 s later; with a Trimmer and AfterBurst its RSS is back
// within 32 MiB of where it started (see TestTrimRSS).
//
// A Trimmer runs one trim Delay (default 2 s) after the last call to
// AfterBurst:
//
//	t, err := trim.New(trim.Config{})
//	if err != nil { ... }
//	defer t.Close()
//	...
//	handleBigRequest()
//	t.AfterBurst()
//
// or, to also keep the trim away from work still running:
//
//	end := t.Begin()
//	defer end()
//
// A trim has two steps: the Go heap step, then the C heap step (CHeap, for
// memory that cgo code got from malloc). When a GC cycle has collected the
// burst since it ended (a service under load), the Go step returns the free
// heap without a GC: a transient GOMEMLIMIT lowered in 4 MiB steps under
// the heap the runtime holds, each made to release through the allocation
// path, the pacer's goal kept above its trigger, the limit restored after
// (50 to 70 ms per GiB returned here, against a whole GC cycle;
// Stats.NoGC, Stats.Aborts). Otherwise (an idle process right after its
// burst, an idle heap with little to scan, TrimNow) it is
// debug.FreeOSMemory, a GC and then the scavenge. Each step is
// skipped when its own figures show too little to give back: the C step
// below Config.MinRelease (default 8 MiB; an unknown C heap figure runs it),
// the Go step below the larger of MinRelease and what its full GC is worth.
// That GC marks the whole live heap whatever it releases, and its cost
// follows the pointers to scan: about 1 ms of CPU for 1 GiB of 64 KiB
// []byte objects, about 0.5 s for 1 GiB of 16.7M two-pointer nodes,
// measured here (TestScanCost); so the Go step must be expected to
// release ReleasePerCPUSecond (64 MiB) per second of estimated GC CPU
// (2 ns per scannable byte, /gc/scan/total:bytes, until a trim measures
// it). Skips are counted by
// reason (Stats.SkippedBy).
//
// One gate for every trim, whoever asks. Automatic trims other than the
// debounced one (on kernel memory pressure, from the GC death-spiral
// detector) call Request with their Origin: it may run a trim sooner than
// the delay, never one with too little to release or past the CPU budget.
// Only TrimNow, for a caller who asks for a trim by name, is forced.
// Trims of every origin are limited together by the CPU they cause, not
// their wall time, so a CPU-throttled container still trims: over any
// window W, the CPU charged to the trims that start in it is at most 2% of
// W plus one trim. Stats.Origins counts each origin's trims, skips and CPU
// apart. A throttled CPU cgroup (its cpu.stat
// throttled time growing by 10% of the wall time or more while the trim is
// pending) starts the trim at half the delay, since a throttled trim takes
// many times its CPU time to finish (Config.FixedDelay turns that off).
// No pattern of calls starves a trim:
// it runs at the latest MaxWait (20 s by default) after the first AfterBurst
// or Begin of its pending period, even while bursts overlap.
//
// A program need not call AfterBurst at all: StartAutoBurst subscribes a
// burst detector to the end of each GC cycle, which takes a live heap at
// twice its recent floor (and 32 MiB over it) for a burst in progress and
// calls AfterBurst for it, so the trim comes one Delay after the last GC
// cycle that saw the burst (see AutoBurst for the rule and its figures).
// memctl.Start starts it by default. A flat live heap gets no trim from it,
// however fast it allocates.
//
// Misuse (an end func called twice) is counted in Stats.Misuse and logged
// once; it panics only under Config.Strict, for tests.
//
// Costs: AfterBurst allocates nothing, starts no goroutine and, but for the
// first call after idle, takes no lock; while a trim is pending it is one
// atomic load. Measured on this repository's shared 2-core test machine
// (go test -run '^$' -bench AfterBurst -benchmem -count 5 ./trim/, same
// run): 1.1 to 1.2 ns/op serial and 0.7 to 1.0 ns/op under RunParallel,
// against 70 to 73 and 79 to 85 ns/op for a mutex plus time.Timer.Reset;
// the first call after idle, which reads the clock (the start of the max
// wait) and sets the timer, about 230 ns. While nothing is pending a Trimmer has
// no goroutine, timer or ticker; while a trim is pending a timer wakes every
// Delay/20. On Linux each pending period also reads /proc/self/cgroup and
// the cgroup mounts of /proc/self/mountinfo once, and its cgroup's cpu.stat
// at its first tick and at each tick from Delay/2 on until the trim (about
// 110 µs, then 36 µs a read, measured on the test machine): none of it on
// the AfterBurst path or while idle.
//
// # Configuration
//
// New takes a Config struct whose zero value is the default, as
// net/http.Server, tls.Config and slog.HandlerOptions do, and as packages
// limits and pressure of this module do: every setting and its default is a
// documented field in one place, a Config is a value that can be built,
// copied and printed, and a field that is left out means the default. A
// field where 0 would be a meaningful setting takes a negative value for it
// (MinRelease: NeverSkip) so that 0 still means the default. New validates
// the Config and returns an error naming the field and its value. Only the
// facade, memctl.Start, takes functional options, because nearly every
// caller passes none; its memctl.WithTrim passes a Config through.
package trim
