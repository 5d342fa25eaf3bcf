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
		w    Watch
		errs []error
		want string
	}{
		{WatchSystem, nil, "Config.Watch is WatchSystem"},
		{WatchAuto, []error{erofs}, "read-only cgroup mount: " + erofs.Error()},
		{WatchAuto, []error{noLimit}, "no memory limit: " + noLimit.Error()},
		{WatchAuto, []error{noCtl}, "no memory controller: " + noCtl.Error()},
		{WatchAuto, []error{errors.New("pressure: open x: permission denied")}, "the cgroup's own source failed: pressure: open x: permission denied"},
		{WatchAuto, []error{noLimit, erofs}, "read-only cgroup mount: " + noLimit.Error() + "\n" + erofs.Error()},
		{WatchAuto, nil, "no memory controller"},
	} {
		assert.Equal(t, tc.want, hostWideNote(tc.w, tc.errs))
	}
}
