// Package trim returns freed memory to the OS a few seconds after a burst
// of work ends.
//
// A Go program that has just served a burst keeps its pages resident for
// minutes: the garbage is collected only at the next GC, and the scavenger
// returns free pages slowly. A Trimmer runs one trim Delay (2 s by default)
// after the last AfterBurst:
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
// A trim has two steps: the Go heap step, then the C heap step for memory
// cgo code got from malloc (package cheap: glibc, jemalloc, mimalloc,
// tcmalloc). Each is skipped when its own estimate shows too little to
// give back (Config.MinRelease), and every trim, whoever asks for it, is
// charged to one budget of 2% of a CPU. memctl.Start runs a Trimmer and a
// burst detector (AutoBurstConfig), so a program need not call AfterBurst.
//
// New takes a Config whose zero value is the default; every field's doc
// says its default, and New returns an error naming an invalid field.
// docs/benchmarks.md has the measurements behind the defaults.
package trim
