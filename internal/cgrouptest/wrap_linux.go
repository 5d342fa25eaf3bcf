package cgrouptest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// Wrap changes cmd (before cmd.Start) so that its process starts in Dir
// (clone3 CLONE_INTO_CGROUP, so every page is charged there) and in the
// layout's namespaces; for Layout.Remount, `/bin/sh -c` remounts cgroup2
// and then execs cmd's program under the same PID. It skips t where sh,
// mount or umount is missing for a remount.
func (g *V2) Wrap(t testing.TB, cmd *exec.Cmd) {
	t.Helper()
	f, err := os.Open(g.Dir)
	if err != nil {
		t.Fatalf("cgrouptest: %v", err)
	}
	t.Cleanup(func() { _ = f.Close() })
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	a := cmd.SysProcAttr
	a.UseCgroupFD, a.CgroupFD = true, int(f.Fd())
	if !g.Layout.Namespace {
		return
	}
	a.Unshareflags |= syscall.CLONE_NEWCGROUP
	if !g.Layout.Remount {
		return
	}
	a.Unshareflags |= syscall.CLONE_NEWNS
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skipf("cgrouptest: layout %s needs sh: %v", g.Layout.Name, err)
	}
	for _, p := range []string{"mount", "umount"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("cgrouptest: layout %s needs %s: %v", g.Layout.Name, p, err)
		}
	}
	opts := "rw"
	if g.Layout.ReadOnly {
		opts = "ro"
	}
	path := cmd.Path
	if path == "" && len(cmd.Args) > 0 {
		path = cmd.Args[0]
	}
	script := `umount "$0" && mount -t cgroup2 -o ` + opts + ` cgroup2 "$0" && exec "$@"`
	args := []string{"sh", "-c", script, g.Mount, path}
	if len(cmd.Args) > 1 {
		args = append(args, cmd.Args[1:]...)
	}
	cmd.Path, cmd.Args = sh, args
}

// cgroup2Mount returns the mount point of the cgroup2 hierarchy that holds
// dir: the topmost directory above it still on cgroup2.
func cgroup2Mount(dir string) (string, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		return "", fmt.Errorf("%s is not on cgroup2 (%v)", dir, err)
	}
	for {
		up := filepath.Dir(dir)
		if up == dir || unix.Statfs(up, &st) != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
			return dir, nil
		}
		dir = up
	}
}
