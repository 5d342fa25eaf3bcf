//go:build !linux

package cgroupfs

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/memctl/memctl/internal/safefs"
)

// Of returns an error matching errors.ErrUnsupported off Linux.
func Of(pid int) (Limit, error) {
	return Limit{}, fmt.Errorf("cgroupfs: cgroups are Linux only, not %s: %w", runtime.GOOS, errors.ErrUnsupported)
}

// OfProc returns an error matching errors.ErrUnsupported off Linux.
func OfProc(proc *safefs.Dir) (Limit, View, error) {
	_, err := Of(0)
	return Limit{}, ViewProcess, err
}

func ofPID(pid int) (Limit, View, []candidate, error) {
	l, err := Of(pid)
	return l, ViewProcess, nil, err
}
