//go:build !linux

package cgrouptest

import (
	"errors"
	"os/exec"
	"testing"
)

// Wrap skips t: cgroup v2 exists only on Linux (NewV2 skips first).
func (g *V2) Wrap(t testing.TB, cmd *exec.Cmd) {
	t.Helper()
	t.Skip("cgrouptest: needs a writable cgroup v2 memory controller: Linux only")
}

func cgroup2Mount(dir string) (string, error) { return "", errors.ErrUnsupported }
