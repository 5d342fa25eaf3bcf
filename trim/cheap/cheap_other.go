//go:build !linux || !cgo

package cheap

import (
	"fmt"
	"runtime"
	"time"
)

// sysStep is empty where the step cannot run.
type sysStep struct{}

func detect() *Step {
	if runtime.GOOS != "linux" {
		return &Step{why: "the C heap step is Linux-only, this is " + runtime.GOOS, unsup: true}
	}
	return &Step{why: "cgo is off (built with CGO_ENABLED=0)"}
}

func (sysStep) release(bool) (int64, int64, time.Duration, error) {
	return 0, 0, 0, fmt.Errorf("%w: not built in", ErrUnavailable)
}

func loadCounts() [2]uint64 { return [2]uint64{} }

func scanHeaps(*Step, map[string][]*heap) ([]*heap, map[string][]*heap) { return nil, nil }

func (sysStep) stats() Stats { return unknownStats(none, "") }

func (sysStep) setArenaMax(int) error {
	return fmt.Errorf("%w: not built in", ErrUnavailable)
}
