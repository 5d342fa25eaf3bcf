// Package cgrouptest creates a real child memory cgroup (v1 memory controller,
// or v2 where the memory controller is delegated) under the test process's
// own cgroup, runs commands inside it, and removes it when the test ends.
//
// Tests that need it skip, with the reason, when the process is not root or
// no writable memory cgroup exists.
//
// For cgroup v2 tests (named TestV2..., run on a real v2 kernel by
// internal/v2vm) NewV2 makes a fresh cgroup laid out as containers use it
// (Layouts: host namespace, a private cgroup namespace rooted at the
// limit, a limit above the namespace root, a read-only mount, a namespace
// that still sees the whole tree), and V2.Wrap starts a command (a child
// of the test binary from internal/childtest, or any program) in it.
// RequireV2 skips, naming the reason, where no writable v2 memory
// controller exists (any cgroup v1 host).
package cgrouptest

import (
	"fmt"
	"os"
	"testing"
	"time"
)

// Group is one child memory cgroup with a limit: Dir, Version and Limit,
// Wrap to run a command inside it and OOMKills to read its OOM kill count.
type Group struct {
	*Child
}

// New creates a child memory cgroup with the given limit in bytes and removes
// it at the end of the test. It skips t, naming the reason, when that is not
// possible here.
func New(t testing.TB, limit int64) *Group {
	t.Helper()
	parent, err := WritableParent()
	if err != nil {
		t.Skipf("cgrouptest: no writable memory cgroup: %v", err)
	}
	c, err := parent.NewChild(fmt.Sprintf("memctl-test-%d-%d", os.Getpid(), time.Now().UnixNano()), limit)
	if err != nil {
		t.Skipf("cgrouptest: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Remove(); err != nil {
			t.Errorf("cgrouptest: %v", err)
		}
	})
	return &Group{c}
}
