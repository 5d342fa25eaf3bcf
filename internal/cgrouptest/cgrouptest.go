// Package cgrouptest creates a real child memory cgroup (v1, or v2 where the
// memory controller is delegated) under the test process's own cgroup, runs
// commands inside it, and removes it when the test ends. Tests skip, with
// the reason, when the process is not root or no writable memory cgroup
// exists.
//
// For cgroup v2, NewV2 makes a fresh cgroup laid out as containers use it
// (Layouts) and V2.Wrap starts a command in it; RequireV2 skips where no
// writable v2 memory controller exists.
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

// New creates a child memory cgroup with limit bytes, removed at the end of
// the test; it skips t, with the reason, where that is not possible.
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
