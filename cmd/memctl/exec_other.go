//go:build !linux

package main

import (
	"errors"
	"fmt"
	"io"
	"runtime"
)

// execProgram fails off Linux: the THP flag is a Linux prctl, and memctl
// does not run a program without the settings it was asked for.
func execProgram(cfg execConfig, args []string, stderr io.Writer) int {
	err := fmt.Errorf("memctl: exec is Linux only, not %s: %w", runtime.GOOS, errors.ErrUnsupported)
	fmt.Fprintln(stderr, err)
	return exitError
}
