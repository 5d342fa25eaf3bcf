package v2vm

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const self = "github.com/memctl/memctl/internal/v2vm"

// TestV2Suite boots the VM and runs every package's TestV2 tests in it
// (package doc). It runs only with MEMCTL_V2VM=1, as it takes minutes, and
// skips with the reason where qemu, apt-get download or the kernel is
// missing. V2VM_TIMEOUT (seconds, default 480) bounds the whole VM run;
// V2VM_RUN (a -test.run pattern, default ^TestV2) and V2VM_PKGS (import
// paths, space-separated) narrow it while working on one test, and
// V2VM_COUNT repeats each test (-test.count).
func TestV2Suite(t *testing.T) {
	if os.Getenv("V2VM_GUEST") != "" {
		t.Skip("v2vm: inside the guest")
	}
	if os.Getenv("MEMCTL_V2VM") != "1" {
		t.Skip("v2vm: the v2 suite boots a VM for minutes; run it with MEMCTL_V2VM=1 go test -count=1 -v -run TestV2Suite ./internal/v2vm")
	}
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skipf("v2vm: no qemu-system-x86_64 (apt-get install qemu-system-x86): %v", err)
	}
	assets, err := Fetch(DefaultCache())
	if err != nil {
		t.Skipf("v2vm: no kernel or busybox: %v", err)
	}
	timeout := 480 * time.Second
	if s := os.Getenv("V2VM_TIMEOUT"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err, "V2VM_TIMEOUT")
		timeout = time.Duration(n) * time.Second
	}
	t0 := time.Now()

	modDir, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	require.NoError(t, err, "go list -m")
	mod := strings.TrimSpace(string(modDir))
	pkgs, others, err := Discover(mod, self)
	require.NoError(t, err)
	require.NotEmpty(t, pkgs, "no package declares a TestV2 test")
	if only := strings.Fields(os.Getenv("V2VM_PKGS")); len(only) > 0 {
		pkgs = slices.DeleteFunc(pkgs, func(p Package) bool { return !slices.Contains(only, p.ImportPath) })
	}
	run := cmp.Or(os.Getenv("V2VM_RUN"), "^TestV2")
	count, _ := strconv.Atoi(os.Getenv("V2VM_COUNT"))
	var names []string
	for _, p := range pkgs {
		names = append(names, p.ImportPath)
	}
	t.Logf("v2vm: packages with TestV2 tests: %s (%d without)", strings.Join(names, " "), len(others))
	cmdPkg := ""
	for _, c := range []string{"./cmd/memctl", "./memctl"} {
		if _, err := os.Stat(filepath.Join(mod, c, "main.go")); err == nil {
			cmdPkg = c
			break
		}
	}
	work := t.TempDir()
	memctlBin := ""
	if cmdPkg != "" {
		memctlBin = filepath.Join(work, "memctl")
	}
	require.NoError(t, Build(mod, work, pkgs, cmdPkg))
	initrd := filepath.Join(work, "initrd.cpio")
	f, err := os.Create(initrd)
	require.NoError(t, err)
	require.NoError(t, Initramfs(f, assets, pkgs, memctlBin, run, count, min(timeout, 4*time.Minute)))
	require.NoError(t, f.Close())
	st, _ := os.Stat(initrd)
	accel, why := Accel()
	t.Logf("v2vm: built in %.0f s; %s, busybox %s, accel %s (%s), initramfs %d MiB, timeout %s",
		time.Since(t0).Seconds(), filepath.Base(assets.Kernel), assets.Busybox, accel, why, st.Size()>>20, timeout)

	log, err := os.Create(filepath.Join(work, "console.log"))
	require.NoError(t, err)
	defer log.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var res *Result
	var bootErr error
	tb := time.Now()
	for try := 1; try <= 2; try++ {
		// A guest that never reached the suite (a kernel panic at boot
		// on a loaded host) is booted once more; a guest that ran the
		// suite is never run twice.
		res = NewResult()
		bootErr = Boot(ctx, qemu, accel, assets, initrd, 4096, func(line string) {
			fmt.Fprintln(log, line)
			fmt.Fprintf(os.Stdout, "guest| %s\n", line)
			res.Line(line)
		})
		if res.Started || ctx.Err() != nil {
			break
		}
		t.Logf("v2vm: boot %d did not reach the suite (%v); booting again", try, bootErr)
	}
	vm := time.Since(tb)
	t.Logf("v2vm: %s; VM %.0f s, total %.0f s", res.Summary(), vm.Seconds(), time.Since(t0).Seconds())
	if bootErr != nil {
		t.Errorf("%v", bootErr)
	}
	failed := res.Failed(names)
	sort.Strings(failed)
	for _, f := range failed {
		t.Errorf("v2vm: failed in the guest: %s", f)
	}
	if res.Top["PASS"]+res.Top["FAIL"] == 0 {
		t.Errorf("v2vm: no TestV2 test ran in the guest (all skipped?)")
	}
}

func TestResult(t *testing.T) {
	r := NewResult()
	for _, l := range strings.Split(`[    1.0] something
V2VM_START uptime=3.1
V2SUITE_PKG a/b
=== RUN   TestV2One
--- PASS: TestV2One (0.10s)
=== RUN   TestV2Two
    --- SKIP: TestV2Two/sub (0.00s)
    --- FAIL: TestV2Two/other (0.00s)
--- FAIL: TestV2Two (0.20s)
V2SUITE_RC a/b 1
V2SUITE_PKG c
--- SKIP: TestV2Three (0.00s)
V2SUITE_RC c 0
V2VM_EXIT=1 uptime=9.0`, "\n") {
		r.Line(l)
	}
	assert.True(t, r.Started)
	assert.Equal(t, 1, r.Exit)
	assert.Equal(t, map[string]int{"PASS": 1, "FAIL": 1, "SKIP": 1}, r.Top)
	assert.Equal(t, map[string]int{"FAIL": 1, "SKIP": 1}, r.Sub)
	assert.Equal(t, "FAIL", r.Tests["a/b.TestV2Two/other"])
	got := r.Failed([]string{"a/b", "c", "d"})
	sort.Strings(got)
	assert.Equal(t, []string{"package a/b: exit code 1", "package d: no exit code (crashed, hung or never ran)", "test a/b.TestV2Two", "test a/b.TestV2Two/other"}, got)
	assert.Contains(t, r.Summary(), "3 tests run in the guest (1 passed, 1 failed, 1 skipped")

	unfinished := NewResult()
	unfinished.Line("V2VM_START")
	assert.Contains(t, unfinished.Failed(nil), "guest: did not finish (no V2VM_EXIT line)")
}

// The archive's headers, names and data sit on 4-byte boundaries and end
// with the trailer, as the kernel's unpacker expects; cpio(1) lists it.
func TestCpio(t *testing.T) {
	var buf bytes.Buffer
	c := &cpioWriter{w: &buf}
	c.entry("d", cpioDir|0o755, nil, 0, 0)
	c.entry("d/f", cpioFile|0o644, []byte("hello"), 0, 0)
	c.entry("dev/console", cpioChar|0o600, nil, 5, 1)
	require.NoError(t, c.close())
	assert.Zero(t, buf.Len()%4)
	assert.True(t, bytes.HasPrefix(buf.Bytes(), []byte("070701")))
	assert.Contains(t, buf.String(), "TRAILER!!!\x00")
	if _, err := exec.LookPath("cpio"); err != nil {
		t.Skipf("no cpio to list the archive: %v", err)
	}
	cmd := exec.Command("cpio", "-t", "--quiet")
	cmd.Stdin = &buf
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Equal(t, "d\nd/f\ndev/console\n", string(out))
}
