// Package trim returns freed memory to the OS a few seconds after a burst of
// work ends. A Trimmer runs one trim Delay (2 s by default) after the last
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
// memctl.Start runs a Trimmer and a burst detector (AutoBurstConfig), so a
// program need not call AfterBurst. Guide: docs/bursts.md; the measurements
// behind the defaults: docs/benchmarks.md.
package trim
