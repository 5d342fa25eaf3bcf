package cgroupfs

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// readTreePIDAsNobody is readTreePID on one thread whose file-system UID
// is nobody's (see readTreeAsNobody); it skips when setfsuid has no effect.
func readTreePIDAsNobody(t *testing.T, dir string, pid int) (Limit, error) {
	t.Helper()
	type res struct {
		l     Limit
		err   error
		noEff bool
	}
	c := make(chan res, 1)
	go func() {
		runtime.LockOSThread() // not unlocked: the thread ends with the goroutine
		_, _ = unix.SetfsuidRetUid(65534)
		if prev, _ := unix.SetfsuidRetUid(65534); prev != 65534 {
			c <- res{noEff: true}
			return
		}
		l, err := readTreePID(dir, pid)
		c <- res{l: l, err: err}
	}()
	r := <-c
	if r.noEff {
		t.Skip("setfsuid had no effect")
	}
	return r.l, r.err
}

// TestWholeTreeNamespaceUnreadableSibling: in the search for the cgroup
// that lists the PID, a directory the reader may not list (another
// tenant's cgroup, mode 0700, read by a process that is not root) is
// passed over: the process's own cgroup, elsewhere in the tree, is found.
// The whole search failed with EACCES, and the limit was unknown.
func TestWholeTreeNamespaceUnreadableSibling(t *testing.T) {
	const pid = 99
	dir, _ := unreadableTreeMI(t, "0::/\n", wholeTreeMount("/../../.."), map[string]string{
		"cg/kubepods/podA/memory.max":              "268435456\n",
		"cg/kubepods/podA/ctr/cgroup.procs":        "99\n",
		"cg/kubepods/private/x/cgroup.procs":       "1\n",
		"cg/system.slice/a.service/x/cgroup.procs": "1\n",
	}, "cg/kubepods/private")
	l, err := readTreePIDAsNobody(t, dir, pid)
	require.NoError(t, err)
	assert.Equal(t, int64(256<<20), l.Bytes)
}

// TestWholeTreeNamespaceUnreadableOwn: where the process's cgroup is under
// the directory the reader may not list, it is not found, and the error
// says what was passed over.
func TestWholeTreeNamespaceUnreadableOwn(t *testing.T) {
	dir, denied := unreadableTreeMI(t, "0::/\n", wholeTreeMount("/../../.."), map[string]string{
		"cg/kubepods/podA/memory.max":       "268435456\n",
		"cg/kubepods/podA/ctr/cgroup.procs": "99\n",
	}, "cg/kubepods/podA")
	_, err := readTreePIDAsNobody(t, dir, 99)
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrUnseen)
	assert.ErrorContains(t, err, "lists PID 99")
	assert.ErrorContains(t, err, "1 directories passed over")
	assert.ErrorContains(t, err, denied)
}
