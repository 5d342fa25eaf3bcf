//go:build !linux || !cgo

package cheap

import (
	"fmt"
	"runtime"
)

// sysStep is empty where the step cannot run.
type sysStep struct{}

func detect() *Step {
	if runtime.GOOS != "linux" {
		return &Step{why: "the C heap step is Linux-only, this is " + runtime.GOOS, unsup: true}
	}
	return &Step{why: "cgo is off (built with CGO_ENABLED=0)"}
}

func (sysStep) release() (int64, error) {
	return 0, fmt.Errorf("%w: not built in", ErrUnavailable)
}

func (sysStep) stats() Stats { return unknownStats(None, "") }

func (sysStep) setArenaMax(int) error {
	return fmt.Errorf("%w: not built in", ErrUnavailable)
}
