package pressure

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"golang.org/x/sys/unix"
)

// The startup line's reason for host-wide PSI names the cause first: a
// read-only mount wins over the rest, then no limit, then no controller.
func TestHostWideNote(t *testing.T) {
	erofs := fmt.Errorf("pressure: register %q: %w", "5 8 low", &os.PathError{Op: "open", Path: "/sys/fs/cgroup/memory/x/cgroup.event_control", Err: unix.EROFS})
	noLimit := ownError{errNoLimit, errors.New("pressure: cgroup v1 /x has no memory limit: watching PSI instead")}
	noCtl := ownError{errNoController, errors.New("cgroupfs: no memory cgroup in /proc/self/cgroup")}
	for _, tc := range []struct {
		errs []error
		want string
	}{
		{[]error{erofs}, "read-only cgroup mount: " + erofs.Error()},
		{[]error{noLimit}, "no memory limit: " + noLimit.Error()},
		{[]error{noCtl}, "no memory controller: " + noCtl.Error()},
		{[]error{errors.New("pressure: open x: permission denied")}, "the cgroup's own source failed: pressure: open x: permission denied"},
		{[]error{noLimit, erofs}, "read-only cgroup mount: " + noLimit.Error() + "\n" + erofs.Error()},
		{nil, "no memory controller"},
	} {
		assert.Equal(t, tc.want, hostWideNote(tc.errs))
	}
}

// The note beside a memory.events source says why the cgroup's own PSI
// trigger was refused, in a few words for the startup line.
func TestPSIRefusedNote(t *testing.T) {
	perm := &os.PathError{Op: "pressure: write trigger", Path: "/sys/fs/cgroup/memory.pressure", Err: unix.EPERM}
	for _, tc := range []struct {
		err    error
		nsRoot bool
		want   string
	}{
		{perm, true, "PSI trigger refused: EPERM at the cgroup namespace root (nsdelegate)"},
		{perm, false, "PSI trigger refused: permission denied"},
		{&os.PathError{Op: "pressure: open", Path: "/sys/fs/cgroup/memory.pressure", Err: unix.EROFS}, true, "PSI trigger refused: read-only cgroup mount"},
		{&os.PathError{Op: "pressure: open", Path: "/x/memory.pressure", Err: unix.ENOENT}, false, "no PSI in this kernel (CONFIG_PSI off or psi=0)"},
		{errors.New("pressure: odd"), false, "PSI trigger refused: pressure: odd"},
	} {
		assert.Equal(t, tc.want, psiRefusedNote(tc.err, tc.nsRoot))
	}
}
