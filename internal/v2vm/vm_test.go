package v2vm

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

//go:embed init.sh
var initScript []byte

// Assets are the guest's kernel and static busybox, as files on the host.
type Assets struct {
	Kernel  string // a vmlinuz
	Busybox string // a statically linked busybox
	// Modules are kernel modules of the same package, in load order
	// (zsmalloc.ko, zram.ko), for swap on a compressed RAM disk; empty when
	// they could not be had: the guest then has no swap.
	Modules []string
}

// DefaultCache is the cache directory for the Debian packages: V2VM_CACHE,
// or v2vm-cache under os.TempDir().
func DefaultCache() string {
	if c := os.Getenv("V2VM_CACHE"); c != "" {
		return c
	}
	return filepath.Join(os.TempDir(), "v2vm-cache")
}

// Fetch returns the kernel (KERNEL, or the newest cache/root/boot/vmlinuz-*)
// and busybox (BUSYBOX, or cache/root/bin/busybox), downloading the Debian
// packages linux-image-amd64 depends on and busybox-static with
// `apt-get download` and unpacking the one file of each with dpkg-deb
// when they are not there yet. The error says which step failed.
func Fetch(cache string) (Assets, error) {
	a := Assets{Kernel: os.Getenv("KERNEL"), Busybox: os.Getenv("BUSYBOX")}
	root := filepath.Join(cache, "root")
	if a.Kernel == "" {
		a.Kernel = newestKernel(root)
		if a.Kernel == "" {
			out, err := exec.Command("apt-cache", "depends", "linux-image-amd64").Output()
			if err != nil {
				return a, fmt.Errorf("v2vm: apt-cache depends linux-image-amd64: %v", err)
			}
			m := regexp.MustCompile(`Depends: (linux-image-[0-9]\S*)`).FindSubmatch(out)
			if m == nil {
				return a, errors.New("v2vm: apt-cache lists no linux-image-[0-9]* for linux-image-amd64 (apt-get update?)")
			}
			// The zram modules (below) come from the same package: one download.
			if err := unpack(cache, string(m[1]), "./boot/vmlinuz-*", "./lib/modules/*/kernel/mm/zsmalloc.ko", "./lib/modules/*/kernel/drivers/block/zram/zram.ko"); err != nil {
				return a, err
			}
			if a.Kernel = newestKernel(root); a.Kernel == "" {
				return a, fmt.Errorf("v2vm: %s has no /boot/vmlinuz-*", m[1])
			}
		}
	}
	// zram gives the guest swap, so that anonymous memory is reclaimable
	// at a cgroup's limit as on a node with swap (tmpfs and the block
	// device's page cache do not serve: without swap neither is reclaimed
	// here): optional.
	ver := strings.TrimPrefix(filepath.Base(a.Kernel), "vmlinuz-")
	mods := []string{"kernel/mm/zsmalloc.ko", "kernel/drivers/block/zram/zram.ko"}
	have := func() bool {
		for _, m := range mods {
			if _, err := os.Stat(filepath.Join(root, "lib", "modules", ver, m)); err != nil {
				return false
			}
		}
		return true
	}
	if !have() && os.Getenv("KERNEL") == "" {
		var pats []string
		for _, m := range mods {
			pats = append(pats, "./lib/modules/"+ver+"/"+m)
		}
		_ = unpack(cache, "linux-image-"+ver, pats...)
	}
	if have() {
		for _, m := range mods {
			a.Modules = append(a.Modules, filepath.Join(root, "lib", "modules", ver, m))
		}
	}
	if a.Busybox == "" {
		a.Busybox = filepath.Join(root, "bin", "busybox")
		if _, err := os.Stat(a.Busybox); err != nil {
			if err := unpack(cache, "busybox-static", "./bin/busybox"); err != nil {
				return a, err
			}
		}
	}
	for _, f := range []string{a.Kernel, a.Busybox} {
		if _, err := os.Stat(f); err != nil {
			return a, fmt.Errorf("v2vm: %w", err)
		}
	}
	return a, nil
}

func newestKernel(root string) string {
	ks, _ := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*"))
	sort.Strings(ks)
	if len(ks) == 0 {
		return ""
	}
	return ks[len(ks)-1]
}

// unpack downloads pkg with apt-get download into a fresh directory under
// cache and extracts the files matching patterns into cache/root, renaming
// each into place so that a concurrent run never sees half a file.
func unpack(cache, pkg string, patterns ...string) error {
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return fmt.Errorf("v2vm: %w", err)
	}
	tmp, err := os.MkdirTemp(cache, "fetch-")
	if err != nil {
		return fmt.Errorf("v2vm: %w", err)
	}
	defer os.RemoveAll(tmp)
	dl := exec.Command("apt-get", "download", pkg)
	dl.Dir = tmp
	if out, err := dl.CombinedOutput(); err != nil {
		return fmt.Errorf("v2vm: apt-get download %s: %v: %s", pkg, err, bytes.TrimSpace(out))
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, pkg+"_*.deb"))
	if len(debs) == 0 {
		return fmt.Errorf("v2vm: apt-get download %s left no .deb", pkg)
	}
	x := filepath.Join(tmp, "x")
	if err := os.Mkdir(x, 0o755); err != nil {
		return fmt.Errorf("v2vm: %w", err)
	}
	sh := exec.Command("sh", append([]string{"-c", `deb=$1 x=$2; shift 2; dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$x" --wildcards "$@"`, "sh", debs[0], x}, patterns...)...)
	if out, err := sh.CombinedOutput(); err != nil {
		return fmt.Errorf("v2vm: unpack %s from %s: %v: %s", strings.Join(patterns, " "), debs[0], err, bytes.TrimSpace(out))
	}
	return filepath.WalkDir(x, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(x, p)
		dst := filepath.Join(cache, "root", rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		return os.Rename(p, dst)
	})
}

// Package is one package of the module whose tests run in the guest.
type Package struct {
	ImportPath string
	Dir        string // its source directory on the host
	Binary     string // its test binary, once Build made it
}

var v2TestFunc = regexp.MustCompile(`(?m)^func TestV2\w*\(`)

// Discover lists the packages of the module in moduleDir (go list ./...,
// which leaves out nested modules) and returns those whose Linux test
// files declare a TestV2 test, and the import paths of the others. skip
// names packages to leave out (this one: the guest has no qemu).
func Discover(moduleDir string, skip ...string) (v2 []Package, others []string, err error) {
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}}|{{.Dir}}|{{join .TestGoFiles ","}},{{join .XTestGoFiles ","}}`, "./...")
	cmd.Dir = moduleDir
	cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH=amd64", "CGO_ENABLED=0")
	out, err := cmd.Output()
	if err != nil {
		return nil, nil, fmt.Errorf("v2vm: go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		parts := strings.SplitN(line, "|", 3)
		if len(parts) != 3 {
			return nil, nil, fmt.Errorf("v2vm: go list: malformed line %q", line)
		}
		p := Package{ImportPath: parts[0], Dir: parts[1]}
		has := false
		for _, f := range strings.Split(parts[2], ",") {
			if f == "" {
				continue
			}
			b, err := os.ReadFile(filepath.Join(p.Dir, f))
			if err != nil {
				return nil, nil, fmt.Errorf("v2vm: %w", err)
			}
			has = has || v2TestFunc.Match(b)
		}
		if has && !contains(skip, p.ImportPath) {
			v2 = append(v2, p)
		} else {
			others = append(others, p.ImportPath)
		}
	}
	return v2, others, nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// Build compiles each package's test binary (with -c, CGO_ENABLED=0,
// linux/amd64) into dir and sets its Binary, and builds the memctl command
// from cmdPkg (for example ./cmd/memctl) into dir/memctl when cmdPkg is
// not empty.
func Build(moduleDir, dir string, pkgs []Package, cmdPkg string) error {
	env := append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	for i := range pkgs {
		out := filepath.Join(dir, fmt.Sprintf("%02d.test", i))
		cmd := exec.Command("go", "test", "-c", "-vet=off", "-o", out, pkgs[i].ImportPath)
		cmd.Dir, cmd.Env = moduleDir, env
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("v2vm: go test -c %s: %v\n%s", pkgs[i].ImportPath, err, b)
		}
		pkgs[i].Binary = out
	}
	if cmdPkg != "" {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "memctl"), cmdPkg)
		cmd.Dir, cmd.Env = moduleDir, env
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("v2vm: go build %s: %v\n%s", cmdPkg, err, b)
		}
	}
	return nil
}

// Initramfs writes the guest's initramfs (an uncompressed newc cpio) to w:
// busybox, /init, a.Modules in /lib (N-name.ko, loaded in order), the memctl command at /payload/bin/memctl when memctl is
// not empty, and for each package its test binary and testdata in
// /payload/p/NN, with a /payload/run.sh that runs each binary in its
// package's folder with -test.run run (normally '^TestV2'), -test.count
// count, -test.parallel 8 (the layouts' subtests wait more than they
// compute), -test.v and timeout, between
// "V2SUITE_PKG <import path>" and "V2SUITE_RC <import path> <exit code>"
// lines.
func Initramfs(w io.Writer, a Assets, pkgs []Package, memctl, run string, count int, timeout time.Duration) error {
	c := &cpioWriter{w: w}
	for _, d := range []string{"bin", "dev", "payload", "payload/bin", "payload/p"} {
		c.entry(d, cpioDir|0o755, nil, 0, 0)
	}
	c.entry("dev/console", cpioChar|0o600, nil, 5, 1)
	c.entry("init", cpioFile|0o755, initScript, 0, 0)
	files := map[string]string{"bin/busybox": a.Busybox}
	if memctl != "" {
		files["payload/bin/memctl"] = memctl
	}
	c.entry("lib", cpioDir|0o755, nil, 0, 0)
	for i, m := range a.Modules {
		files[fmt.Sprintf("lib/%d-%s", i, filepath.Base(m))] = m
	}
	var sh strings.Builder
	sh.WriteString("# Written by internal/v2vm: each package's TestV2 tests.\nrc=0\n")
	for i, p := range pkgs {
		dir := fmt.Sprintf("payload/p/%02d", i)
		c.entry(dir, cpioDir|0o755, nil, 0, 0)
		files[dir+"/pkg.test"] = p.Binary
		if err := addTree(c, filepath.Join(p.Dir, "testdata"), dir+"/testdata"); err != nil {
			return err
		}
		fmt.Fprintf(&sh, "echo 'V2SUITE_PKG %s'\n(cd /%s && ./pkg.test -test.run '%s' -test.count %d -test.parallel 8 -test.v -test.timeout %s)\nr=$?\necho \"V2SUITE_RC %s $r\"\n[ $r = 0 ] || rc=1\n",
			p.ImportPath, dir, strings.ReplaceAll(run, "'", ""), max(count, 1), timeout, p.ImportPath)
	}
	sh.WriteString("exit $rc\n")
	c.entry("payload/run.sh", cpioFile|0o755, []byte(sh.String()), 0, 0)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		b, err := os.ReadFile(files[n])
		if err != nil {
			return fmt.Errorf("v2vm: %w", err)
		}
		c.entry(n, cpioFile|0o755, b, 0, 0)
	}
	return c.close()
}

// addTree adds the regular files and directories under src (absent: none)
// at dst.
func addTree(c *cpioWriter, src, dst string) error {
	if _, err := os.Stat(src); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		name := filepath.ToSlash(filepath.Join(dst, rel))
		switch {
		case d.IsDir():
			c.entry(name, cpioDir|0o755, nil, 0, 0)
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			c.entry(name, cpioFile|0o644, b, 0, 0)
		}
		return nil
	})
}

// Accel returns "kvm" where a stock kernel boots under KVM here (/dev/kvm
// writable and vmx or svm in /proc/cpuinfo) and "tcg" otherwise, with the
// reason; V2VM_ACCEL overrides it.
func Accel() (accel, why string) {
	if a := os.Getenv("V2VM_ACCEL"); a != "" {
		return a, "V2VM_ACCEL"
	}
	if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err != nil {
		return "tcg", fmt.Sprintf("/dev/kvm unusable: %v", err)
	} else {
		f.Close()
	}
	b, _ := os.ReadFile("/proc/cpuinfo")
	if !regexp.MustCompile(`(?m)^flags\s*:.*\b(vmx|svm)\b`).Match(b) {
		return "tcg", "no vmx/svm in /proc/cpuinfo (a PVM host runs only PVM-built kernels)"
	}
	return "kvm", "/dev/kvm with vmx/svm"
}

// Boot runs qemu (qemuPath) with the kernel and initramfs, 2 vCPUs and
// memMiB of memory, until the guest powers off or ctx ends, calling line
// for each console line as it arrives. The kernel command line turns PSI
// on (psi=1) and cgroup v1 off (cgroup_no_v1=all); no_timer_check skips
// the IO-APIC timer check that a slow TCG guest on a loaded host can fail
// ("IO-APIC + timer doesn't work", a kernel panic before init).
func Boot(ctx context.Context, qemuPath, accel string, a Assets, initrd string, memMiB int, line func(string)) error {
	args := []string{"-accel", accel, "-cpu", "max"}
	if accel == "kvm" {
		args = []string{"-accel", "kvm", "-cpu", "host"}
	} else if accel == "tcg" {
		// One host thread per vCPU (MTTCG; x86 on x86 keeps its memory
		// order): on a single thread the guest's two vCPUs share one host
		// core, and a test that throttles one child under memory.high
		// slows the others' follow of the limit past their bounds.
		// V2VM_TCG_THREAD=single gives the one-thread mode back.
		args = []string{"-accel", "tcg,thread=" + cmp.Or(os.Getenv("V2VM_TCG_THREAD"), "multi"), "-cpu", "max"}
	}
	args = append(args, "-machine", "q35", "-smp", "2", "-m", strconv.Itoa(memMiB),
		"-kernel", a.Kernel, "-initrd", initrd,
		"-append", "console=ttyS0 rdinit=/init psi=1 panic=-1 no_timer_check quiet loglevel=4 cgroup_no_v1=all systemd.unified_cgroup_hierarchy=1",
		"-display", "none", "-no-user-config", "-nodefaults", "-no-reboot",
		"-chardev", "stdio,id=s0,signal=off", "-serial", "chardev:s0")
	cmd := exec.CommandContext(ctx, qemuPath, args...)
	cmd.WaitDelay = 5 * time.Second
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("v2vm: %w", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line(strings.TrimRight(sc.Text(), "\r"))
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	err := cmd.Wait()
	pw.Close()
	<-done
	if ctx.Err() != nil {
		return fmt.Errorf("v2vm: qemu stopped: %w", ctx.Err())
	}
	if err != nil {
		return fmt.Errorf("v2vm: qemu: %w", err)
	}
	return nil
}
