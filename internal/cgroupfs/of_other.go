//go:build !linux

package cgroupfs

import (
	"errors"
	"fmt"
	"runtime"
)

// Of returns an error matching errors.ErrUnsupported off Linux.
func Of(pid int) (Limit, error) {
	return Limit{}, fmt.Errorf("cgroupfs: cgroups are Linux only, not %s: %w", runtime.GOOS, errors.ErrUnsupported)
}
