//go:build !linux

package thpflag

import (
	"errors"
	"fmt"
	"runtime"
)

var errUnsupported = fmt.Errorf("thp: transparent huge pages are Linux only, not %s: %w", runtime.GOOS, errors.ErrUnsupported)

// Set returns an error matching errors.ErrUnsupported off Linux.
func Set(int) error { return errUnsupported }

// Get returns an error matching errors.ErrUnsupported off Linux.
func Get() (int, error) { return Enabled, errUnsupported }
