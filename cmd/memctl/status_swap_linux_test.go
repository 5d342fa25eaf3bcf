package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgrouptest"
)

// TestV2StatusSwap: `memctl status` on a process in a real cgroup v2
// memory cgroup shows the cgroup's memory.swap.current and memory.swap.max
// (512 MiB, then "max": null) and the process's VmSwap (the VM has no swap
// device: 0), read inside the process's root, in the host layout and in a
// container's own cgroup namespace and mount.
func TestV2StatusSwap(t *testing.T) {
	cgrouptest.RequireV2(t)
	for _, l := range []cgrouptest.Layout{cgrouptest.LayoutHost, cgrouptest.LayoutContainer} {
		t.Run(l.Name, func(t *testing.T) {
			g := cgrouptest.NewV2(t, l, 256<<20)
			setSwapMax := func(v string) {
				require.NoError(t, os.WriteFile(filepath.Join(g.Dir, "memory.swap.max"), []byte(v), 0o644))
			}
			setSwapMax(strconv.Itoa(512 << 20))
			target := startStallIn(t, 16, func(cmd *exec.Cmd) { g.Wrap(t, cmd) })
			status := func() statusReport {
				out, errOut, code := result(t, memctl(t, nil, "status", "-json", "-pid", strconv.Itoa(target.pid)))
				require.Equal(t, exitOK, code, "stderr: %s\nstdout: %s", errOut, out)
				var st statusReport
				require.NoError(t, json.Unmarshal([]byte(out), &st))
				return st
			}
			st := status()
			require.NotNil(t, st.Cgroup)
			assert.Equal(t, 2, st.Cgroup.Version)
			require.NotNil(t, st.Cgroup.Swap, "swap note: %s", st.Cgroup.SwapNote)
			sw := st.Cgroup.Swap
			assert.Equal(t, int64(0), sw.CurrentBytes, "no swap device in the VM")
			require.NotNil(t, sw.MaxBytes)
			assert.Equal(t, int64(512<<20), *sw.MaxBytes)
			assert.False(t, sw.MemoryPlusSwap)
			assert.True(t, strings.HasSuffix(sw.CurrentFile, "/memory.swap.current"), sw.CurrentFile)
			assert.True(t, strings.HasSuffix(sw.MaxFile, "/memory.swap.max"), sw.MaxFile)
			require.NotNil(t, st.VmSwapBytes)
			assert.Equal(t, int64(0), *st.VmSwapBytes)
			require.NotNil(t, st.Cgroup.LimitBytes)
			assert.Equal(t, int64(256<<20), *st.Cgroup.LimitBytes, "the limit is memory.max, swap apart")

			setSwapMax("max")
			st = status()
			require.NotNil(t, st.Cgroup.Swap)
			assert.Nil(t, st.Cgroup.Swap.MaxBytes, `"max" is no limit`)

			out, _, code := result(t, memctl(t, nil, "status", "-pid", strconv.Itoa(target.pid)))
			require.Equal(t, exitOK, code)
			assert.Regexp(t, `(?m)^cgroup swap +0 bytes in swap from ".*/memory\.swap\.current"; no limit from ".*/memory\.swap\.max"$`, out)
			assert.Regexp(t, `(?m)^VmSwap +0 bytes$`, out)
		})
	}
}

// swapHostileSetup: in a private mount namespace, the process puts over
// its cgroup's swap usage file (v1 memory.memsw.usage_in_bytes, v2
// memory.swap.current) what $KIND says, bind-mounted: a FIFO, /dev/zero,
// or a file of escapes on another file system. The limit file stays real.
const swapHostileSetup = findCgroupSetup + `[ -n "$point" ] || { echo "NO-CGROUP-MOUNT"; exit 1; }
swap=memory.swap.current
[ "$file" = memory.limit_in_bytes ] && swap=memory.memsw.usage_in_bytes
[ -e "$point$cg/$swap" ] || { echo "NO-SWAP-FILE"; exit 1; }
case "$KIND" in
fifo) mkfifo "$TMP/f"; mount --bind "$TMP/f" "$point$cg/$swap" ;;
zero) mount --bind /dev/zero "$point$cg/$swap" ;;
garbage) printf '1\033[2J\n' > "$TMP/g"; mount --bind "$TMP/g" "$point$cg/$swap" ;;
esac
echo READY
read x || true
`

// TestStatusSwapHostile: the swap files are read as the limit file is
// (inside the process's root, regular files of a cgroup file system
// only): a process that bind-mounts a FIFO, /dev/zero or a file of escapes
// over its own swap usage file gets "swap" unknown with the reason, quoted,
// and status neither hangs nor prints what the file holds.
func TestStatusSwapHostile(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a private mount namespace")
	}
	for kind, want := range map[string]string{
		"fifo":    "not a regular file: a FIFO",
		"zero":    "not a regular file: a character device",
		"garbage": "file system refused: ",
	} {
		t.Run(kind, func(t *testing.T) {
			dir := t.TempDir()
			pid := startShell(t, swapHostileSetup, &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}, "KIND="+kind, "TMP="+dir)
			p := strconv.Itoa(pid)
			table, errOut, code := result(t, memctl(t, nil, "status", "-pid", p))
			js, _, jsCode := result(t, memctl(t, nil, "status", "-json", "-pid", p))
			assert.Equal(t, exitPartial, code)
			assert.Equal(t, exitPartial, jsCode)
			assert.Empty(t, errOut)
			for _, s := range []string{table, js} {
				assert.NotContains(t, s, "\x1b", "no raw ESC")
			}
			var doc statusReport
			require.NoError(t, json.Unmarshal([]byte(js), &doc))
			require.NotNil(t, doc.Cgroup, "the cgroup and its limit are still read")
			assert.Nil(t, doc.Cgroup.Swap)
			assert.Contains(t, doc.Unknown["swap"], want)
			assert.Contains(t, doc.Unknown["swap"], `"/proc/`+p+`/root/`, "the error names the file, quoted")
			assert.Regexp(t, `(?m)^cgroup swap +unknown: `, table)
		})
	}
}
