//go:build !linux

package cgrouptest

import (
	"os/exec"
	"testing"
)

// RequireV2 skips t: cgroup v2 exists only on Linux.
func RequireV2(t testing.TB) string {
	t.Helper()
	t.Skip("cgrouptest: needs a writable cgroup v2 memory controller: Linux only")
	return ""
}

// V2 is a cgroup v2 memory cgroup for one test; Linux only.
type V2 struct {
	Layout                    Layout
	Top, Dir, LimitDir, Mount string
	Limit                     int64
}

// NewV2 skips t: cgroup v2 exists only on Linux.
func NewV2(t testing.TB, l Layout, limit int64) *V2 {
	t.Helper()
	RequireV2(t)
	return nil
}

// The methods of V2 are never reached off Linux: NewV2 skips.

func (g *V2) SetMax(t testing.TB, bytes int64)                 {}
func (g *V2) SetHigh(t testing.TB, bytes int64)                {}
func (g *V2) Events(t testing.TB, dir string) map[string]int64 { return nil }
func (g *V2) Current(t testing.TB) int64                       { return 0 }
func (g *V2) Wrap(t testing.TB, cmd *exec.Cmd)                 {}
func (g *V2) SetSwapMax(t testing.TB, bytes int64)             {}

// RequireSwap skips t: the v2 VM is Linux only.
func RequireSwap(t testing.TB) {
	t.Helper()
	t.Skip("cgrouptest: no swap: Linux only")
}
