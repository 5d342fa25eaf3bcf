//go:build !linux

package thp

import (
	"errors"
	"fmt"
	"runtime"
)

var errUnsupported = fmt.Errorf("thp: transparent huge pages are Linux only, not %s: %w", runtime.GOOS, errors.ErrUnsupported)

// Disable returns an error matching errors.ErrUnsupported off Linux.
func Disable() error { return errUnsupported }

// DisableExceptAdvised returns an error matching errors.ErrUnsupported off Linux.
func DisableExceptAdvised() error { return errUnsupported }

// Enable returns an error matching errors.ErrUnsupported off Linux.
func Enable() error { return errUnsupported }

// Process returns StateEnabled and an error matching errors.ErrUnsupported off Linux.
func Process() (State, error) { return StateEnabled, errUnsupported }

// System returns an error matching errors.ErrUnsupported off Linux.
func System() (Settings, error) { return Settings{}, errUnsupported }

// AnonHugePages returns an error matching errors.ErrUnsupported off Linux.
func AnonHugePages() (int64, error) { return 0, errUnsupported }

// AnonHugePagesOf returns an error matching errors.ErrUnsupported off Linux.
func AnonHugePagesOf(pid int) (int64, error) { return 0, errUnsupported }
