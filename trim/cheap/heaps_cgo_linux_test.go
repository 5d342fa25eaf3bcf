//go:build linux && cgo && !race

// Not under -race: its shadow memory is never returned, so RSS figures
// mean nothing there.

package cheap_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/internal/dlburst"
	"github.com/memctl/memctl/internal/procfs"
	"github.com/memctl/memctl/trim"
	"github.com/memctl/memctl/trim/cheap"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	jemallocSO  = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
	jemallocPIC = "/usr/lib/x86_64-linux-gnu/libjemalloc_pic.a" // Debian libjemalloc-dev
	// staticTLS lets dlopen load Debian's jemalloc, built with
	// initial-exec TLS, after the start.
	staticTLS = "GLIBC_TUNABLES=glibc.rtld.optional_static_tls=65536"
	libcSO    = "/lib/x86_64-linux-gnu/libc.so.6"
)

func childRSS() int64 {
	n, err := procfs.RSS(0)
	if err != nil {
		childtest.Fail("%v", err)
	}
	return n
}

// childDlopenTrim is the input: a library's allocator dlopened
// (CHEAP_DL_LOCAL=1: RTLD_LOCAL) from CHEAP_DL_PATH, 500 MiB allocated
// through that handle's CHEAP_DL_PREFIX+"malloc" in 4 to 64 KiB blocks and
// freed, then AfterBurst on a Trimmer (200 ms delay); VmRSS once
// the due trim has run, and every allocator found.
func childDlopenTrim() {
	tr, err := trim.New(trim.Config{Delay: 200 * time.Millisecond}) // the delay is not the subject
	if err != nil {
		childtest.Fail("%v", err)
	}
	defer tr.Close()
	childtest.Say("RSS_START", childRSS())
	path, then := os.Getenv("CHEAP_DL_PATH"), os.Getenv("CHEAP_DL_THEN")
	if then == "chdir" {
		dir, base := filepath.Split(path)
		if err := os.Chdir(dir); err != nil {
			childtest.Fail("%v", err)
		}
		path = "./" + base
	}
	run := func(path, prefix string, total, minSize, maxSize int64) error {
		return dlburst.Run(path, os.Getenv("CHEAP_DL_LOCAL") == "1", prefix, total, minSize, maxSize)
	}
	if os.Getenv("CHEAP_DL_LOCAL") == "namespace" {
		run = dlburst.RunNamespace
	}
	if err := run(path, os.Getenv("CHEAP_DL_PREFIX"), 500<<20, 4<<10, 64<<10); err != nil {
		childtest.Fail("%v", err)
	}
	if err := afterLoad(then, path); err != nil {
		childtest.Fail("%v", err)
	}
	childtest.Say("RSS_BURST", childRSS())
	t0 := time.Now()
	tr.AfterBurst()
	// Until the due trim has run (or been skipped), up to the max wait and
	// a delay more: a loaded machine may schedule it late.
	for s := tr.Stats(); s.Trims+s.Skipped == 0 && time.Since(t0) < tr.MaxWait()+tr.Delay(); s = tr.Stats() {
		time.Sleep(50 * time.Millisecond)
	}
	childtest.Say("RSS_AFTER", childRSS())
	s := tr.Stats()
	childtest.Say("TRIMS", s.Trims)
	childtest.Say("SKIPPED", s.Skipped)
	childtest.Say("RELEASED", s.LastReleased)
	hs := cheap.Detect().Heaps()
	childtest.Say("HEAPS", len(hs))
	for i, h := range hs {
		k := "HEAP" + strconv.Itoa(i)
		childtest.Say(k, h.String())
		childtest.Say(k+"_ALLOCATOR", h.Allocator)
		childtest.Say(k+"_LIBRARY", h.Library)
		childtest.Say(k+"_PREFIX", h.Prefix)
		childtest.Say(k+"_OWNS", h.OwnsMalloc)
		childtest.Say(k+"_TRIMMED", h.Trimmed)
		childtest.Say(k+"_RELEASED", h.LastReleased)
		childtest.Say(k+"_RELEASES", h.Releases)
		childtest.Say(k+"_NOTE", h.Note)
		childtest.Say(k+"_NAMESPACE", h.Namespace)
	}
}

func init() { cheap.ExtraChildren["dlopen-trim"] = childDlopenTrim }

// afterLoad does to the loaded library's file what CHEAP_DL_THEN says:
// "delete" removes it, "chdir" leaves the directory that its relative name
// was opened from, "replace" renames another build (the C library) over it,
// as a package upgrade does; "" nothing.
func afterLoad(then, path string) error {
	switch then {
	case "":
		return nil
	case "delete":
		return os.Remove(path)
	case "chdir":
		return os.Chdir("/")
	case "replace":
		data, err := os.ReadFile(libcSO)
		if err != nil {
			return err
		}
		if err := os.WriteFile(path+".new", data, 0o755); err != nil {
			return err
		}
		return os.Rename(path+".new", path)
	}
	return fmt.Errorf("CHEAP_DL_THEN=%q: not delete, chdir or replace", then)
}

type dlCase struct {
	path, prefix, then string
	local              bool
	namespace          bool // dlmopen in a new namespace (local is then ignored)
}

func runDlopen(t *testing.T, c dlCase) map[string]string {
	t.Helper()
	if os.Getenv("LD_PRELOAD") != "" {
		t.Skip("LD_PRELOAD is set for the tests themselves")
	}
	if cheap.Detect().Allocator() != "glibc" {
		t.Skip("the child needs glibc to own malloc")
	}
	env := []string{staticTLS, "CHEAP_DL_PATH=" + c.path, "CHEAP_DL_PREFIX=" + c.prefix, "CHEAP_DL_THEN=" + c.then}
	switch {
	case c.namespace:
		env = append(env, "CHEAP_DL_LOCAL=namespace")
	case c.local:
		env = append(env, "CHEAP_DL_LOCAL=1")
	}
	r := childtest.Report(t, childtest.Command(t, "dlopen-trim", []string{"LD_PRELOAD", "MALLOC_ARENA_MAX", "GLIBC_TUNABLES", "GODEBUG", "GOGC"}, env...))
	n, _ := strconv.Atoi(r["HEAPS"])
	var heaps []string
	for i := 0; i < n; i++ {
		heaps = append(heaps, r["HEAP"+strconv.Itoa(i)])
	}
	t.Logf("RSS start %.1f MiB, after the burst %.1f MiB, after the trim %.1f MiB; trims %s, skipped %s, released %s B; heaps:\n  %s",
		mib(t, r, "RSS_START"), mib(t, r, "RSS_BURST"), mib(t, r, "RSS_AFTER"), r["TRIMS"], r["SKIPPED"], r["RELEASED"], strings.Join(heaps, "\n  "))
	return r
}

func mib(t *testing.T, r map[string]string, k string) float64 {
	t.Helper()
	return float64(childtest.RequireInt(t, r, k)) / (1 << 20)
}

// findHeap returns the index of the heap of allocator in library (a
// suffix) with prefix in the child's report, or -1.
func findHeap(r map[string]string, allocator, library, prefix string) int {
	n, _ := strconv.Atoi(r["HEAPS"])
	for i := 0; i < n; i++ {
		k := "HEAP" + strconv.Itoa(i)
		if r[k+"_ALLOCATOR"] == allocator && strings.HasSuffix(r[k+"_LIBRARY"], library) && r[k+"_PREFIX"] == prefix {
			return i
		}
	}
	return -1
}

func checkDlopen(t *testing.T, r map[string]string, lib, prefix string) {
	t.Helper()
	start, burst := mib(t, r, "RSS_START"), mib(t, r, "RSS_BURST")-mib(t, r, "RSS_START")
	if burst <= 150 {
		t.Skipf("the freed burst left only %.0f MiB resident in the library's jemalloc (its own decay returned the rest while a loaded machine made it slowly): nothing to trim", burst)
	}
	// A tenth of the burst, never under the 30 MiB of the test's first
	// bound: what the trim leaves does not shrink with the burst.
	assert.Less(t, mib(t, r, "RSS_AFTER"), max(start+0.1*burst, 30), "VmRSS after the trim AfterBurst asked for: back within a tenth of the burst, or under 30 MiB")
	assert.Equal(t, "1", r["TRIMS"], "the one trim AfterBurst asked for")
	assert.Equal(t, "glibc", r["HEAP0_ALLOCATOR"])
	assert.Equal(t, "true", r["HEAP0_OWNS"])
	i := findHeap(r, "jemalloc", lib, prefix)
	require.GreaterOrEqual(t, i, 0, "the report names the library's jemalloc")
	k := "HEAP" + strconv.Itoa(i)
	assert.Equal(t, "false", r[k+"_OWNS"])
	assert.Equal(t, "true", r[k+"_TRIMMED"])
	rel := childtest.RequireInt(t, r, k+"_RELEASED")
	assert.Greater(t, rel, int64(150<<20), "jemalloc's own account of what it released")
}

// TestDlopenLocalJemalloc: issue 21's input 1, Debian's libjemalloc.so.2
// dlopened with RTLD_LOCAL.
func TestDlopenLocalJemalloc(t *testing.T) {
	t.Parallel() // child processes only
	if testing.Short() {
		t.Skip("a 500 MiB burst and a 4 s wait")
	}
	if _, err := os.Stat(jemallocSO); err != nil {
		t.Skipf("needs Debian's libjemalloc2: %v", err)
	}
	r := runDlopen(t, dlCase{path: jemallocSO, local: true})
	checkDlopen(t, r, "libjemalloc.so.2", "")
}

// TestDlmopenJemalloc: a jemalloc loaded in a new link-map namespace
// (dlmopen, a plugin isolated with its own C library), which
// dl_iterate_phdr does not list, is found through glibc's namespace chain,
// released and reported with its namespace. Before the fix it was neither
// trimmed nor reported (VmRSS stayed at 207 MiB).
func TestDlmopenJemalloc(t *testing.T) {
	t.Parallel() // child processes only
	if testing.Short() {
		t.Skip("a 500 MiB burst and a 4 s wait")
	}
	if _, err := os.Stat(jemallocSO); err != nil {
		t.Skipf("needs Debian's libjemalloc2: %v", err)
	}
	r := runDlopen(t, dlCase{path: jemallocSO, namespace: true})
	checkDlopen(t, r, "libjemalloc.so.2", "")
	k := "HEAP" + strconv.Itoa(findHeap(r, "jemalloc", "libjemalloc.so.2", ""))
	ns, _ := strconv.Atoi(r[k+"_NAMESPACE"])
	assert.Greater(t, ns, 0, "the namespace dlmopen made")
	assert.Contains(t, r[k], "namespace")
}

// TestDlopenJemallocFileGone: the library's file is not the loaded image
// any more when memctl scans: deleted after the dlopen (a plugin extracted
// to a temporary file), opened by a relative name from a directory the
// process has left, or replaced on disk by another build (an upgrade). Its
// jemalloc is still found (its symbols read from the loaded image) and
// released. Before the fix it was neither trimmed nor reported.
func TestDlopenJemallocFileGone(t *testing.T) {
	t.Parallel() // child processes only
	if testing.Short() {
		t.Skip("a 500 MiB burst and a 4 s wait in each case")
	}
	data, err := os.ReadFile(jemallocSO)
	if err != nil {
		t.Skipf("needs Debian's libjemalloc2: %v", err)
	}
	if _, err := os.Stat(libcSO); err != nil {
		t.Skipf("needs %s for the replacement build: %v", libcSO, err)
	}
	for _, then := range []string{"delete", "chdir", "replace"} {
		t.Run(then, func(t *testing.T) {
			so := filepath.Join(t.TempDir(), "libjcopy21.so")
			require.NoError(t, os.WriteFile(so, data, 0o755))
			r := runDlopen(t, dlCase{path: so, local: true, then: then})
			checkDlopen(t, r, "libjcopy21.so", "")
			k := "HEAP" + strconv.Itoa(findHeap(r, "jemalloc", "libjcopy21.so", ""))
			assert.Contains(t, r[k+"_NOTE"], "symbols read from the loaded image")
		})
	}
}

// buildJemallocSO links Debian's static jemalloc (libjemalloc_pic.a) into
// a shared object in dir. With prefix, its public calls are renamed
// prefix+name (objcopy --redefine-syms, the way a build with
// --with-jemalloc-prefix names them) and only those are exported; with
// hidden, nothing of jemalloc is exported: a library that bundles a private
// copy (RocksDB), reached only through its own wrapper, hidden_alloc and
// hidden_free.
func buildJemallocSO(t *testing.T, dir, prefix string, hidden bool) string {
	return buildJemalloc(t, dir, prefix, hidden, false)
}

// buildJemalloc is buildJemallocSO; with archiveOnly it returns the
// renamed static archive (je2.a) instead of linking a shared object.
func buildJemalloc(t *testing.T, dir, prefix string, hidden, archiveOnly bool) string {
	t.Helper()
	if _, err := os.Stat(jemallocPIC); err != nil {
		t.Skipf("needs Debian's libjemalloc-dev (%s): %v", jemallocPIC, err)
	}
	for _, tool := range []string{"gcc", "objcopy", "ar"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s: %v", tool, err)
		}
	}
	run := func(name string, args ...string) {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s %v: %s", name, args, out)
	}
	a := filepath.Join(dir, "je.a")
	data, err := os.ReadFile(jemallocPIC)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(a, data, 0o644))
	run("ar", "d", a, "jemalloc_cpp.pic.o") // operator new and delete: not needed here, and they want libstdc++
	var redefine []string
	for _, s := range []string{"malloc", "calloc", "realloc", "free", "mallctl", "mallctlbymib", "mallctlnametomib",
		"malloc_stats_print", "malloc_usable_size", "mallocx", "rallocx", "xallocx", "sallocx", "dallocx", "sdallocx",
		"nallocx", "posix_memalign", "aligned_alloc", "memalign", "valloc", "malloc_conf", "malloc_message", "malloc_conf_2_conf_harder"} {
		redefine = append(redefine, s+" "+prefix+s)
	}
	exported := prefix + "*"
	src := filepath.Join(dir, "wrap.c")
	if hidden {
		exported = "hidden_*"
		require.NoError(t, os.WriteFile(src, []byte(`#include <stddef.h>
void *`+prefix+`malloc(size_t);
void `+prefix+`free(void *);
void *hidden_malloc(size_t n) { return `+prefix+`malloc(n); }
void hidden_free(void *p) { `+prefix+`free(p); }
`), 0o644))
	} else {
		require.NoError(t, os.WriteFile(src, []byte("int jeprefix_marker;\n"), 0o644))
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "syms"), []byte(strings.Join(redefine, "\n")+"\n"), 0o644))
	run("objcopy", "--redefine-syms=syms", a, filepath.Join(dir, "je2.a"))
	if archiveOnly {
		return filepath.Join(dir, "je2.a")
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "v.map"), []byte("{ global: "+exported+"; local: *; };\n"), 0o644))
	so := filepath.Join(dir, "libjetest.so")
	run("gcc", "-shared", "-o", so, "wrap.c", "-Wl,--whole-archive", "je2.a", "-Wl,--no-whole-archive",
		"-Wl,--version-script=v.map", "-Wl,-s", "-lpthread", "-ldl", "-lm")
	return so
}

// TestDlopenPrefixedJemalloc: a jemalloc whose calls are named je_mallctl,
// je_malloc... (Badger's build, tikv-jemallocator's _rjem_), loaded with
// RTLD_LOCAL and with RTLD_GLOBAL.
func TestDlopenPrefixedJemalloc(t *testing.T) {
	t.Parallel() // child processes only
	if testing.Short() {
		t.Skip("a 500 MiB burst and a 4 s wait")
	}
	for _, c := range []struct {
		prefix string
		local  bool
	}{{"je_", true}, {"_rjem_", false}} {
		t.Run(c.prefix, func(t *testing.T) {
			so := buildJemallocSO(t, t.TempDir(), c.prefix, false)
			r := runDlopen(t, dlCase{path: so, prefix: c.prefix, local: c.local})
			checkDlopen(t, r, "libjetest.so", c.prefix)
		})
	}
}

// TestHiddenJemalloc: a library carries its own jemalloc and exports none
// of it (stripped): reported present and not trimmed, never as handled.
func TestHiddenJemalloc(t *testing.T) {
	t.Parallel() // child processes only
	if testing.Short() {
		t.Skip("a 500 MiB burst and a 4 s wait")
	}
	so := buildJemallocSO(t, t.TempDir(), "", true)
	r := runDlopen(t, dlCase{path: so, prefix: "hidden_", local: true})
	i := findHeap(r, "jemalloc", "libjetest.so", "")
	require.GreaterOrEqual(t, i, 0, "the hidden copy is reported")
	k := "HEAP" + strconv.Itoa(i)
	assert.Equal(t, "false", r[k+"_TRIMMED"])
	assert.Equal(t, "0", r[k+"_RELEASES"])
	assert.Contains(t, r[k], "present, not trimmed")
	assert.Greater(t, mib(t, r, "RSS_AFTER"), 150.0, "nothing could release it")
}

// staticMain is a Go program that links a je_-prefixed jemalloc statically
// through cgo, as Badger's -tags=jemalloc build does: nothing of it is
// exported, so only the executable's symbol table names je_mallctl. It
// allocates 500 MiB through je_malloc in 4 to 64 KiB blocks, frees them,
// and releases with memctl's C heap step.
const staticMain = `package main

/*
#cgo LDFLAGS: ${SRCDIR}/je2.a -lpthread -ldl -lm
#include <stdlib.h>
#include <string.h>
void *je_malloc(size_t);
void je_free(void *);
static int burst(long long total) {
	long cap = (long)(total / 4096) + 1;
	void **p = calloc((size_t)cap, sizeof(void *));
	if (p == NULL) return -1;
	unsigned long long x = 88172645463325252ull;
	long n = 0;
	for (long long done = 0; done < total && n < cap; n++) {
		x ^= x << 13; x ^= x >> 7; x ^= x << 17;
		size_t sz = 4096 + (size_t)(x % (60 * 1024 + 1));
		p[n] = je_malloc(sz);
		if (p[n] == NULL) return -2;
		memset(p[n], 0x5a, sz);
		done += (long long)sz;
	}
	for (long i = 0; i < n; i++) je_free(p[i]);
	free(p);
	return 0;
}
*/
import "C"

import (
	"fmt"
	"os"
	"strings"

	"github.com/memctl/memctl/trim/cheap"
)

func rss() int64 {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			var kb int64
			fmt.Sscanf(strings.TrimSpace(strings.TrimPrefix(l, "VmRSS:")), "%d", &kb)
			return kb << 10
		}
	}
	return -1
}

func main() {
	fmt.Printf("RSS_START=%d\n", rss())
	if C.burst(500 << 20) != 0 {
		fmt.Println("FAIL=burst")
		os.Exit(1)
	}
	fmt.Printf("RSS_BURST=%d\n", rss())
	s := cheap.Detect()
	released, err := s.Release()
	fmt.Printf("RELEASED=%d\nERR=%v\nRSS_AFTER=%d\n", released, err, rss())
	for i, h := range s.Heaps() {
		fmt.Printf("HEAP%d=%s\nHEAP%d_NOTE=%s\n", i, h, i, h.Note)
	}
}
`

// TestStaticPrefixedJemallocInExecutable: a je_ jemalloc linked into a Go
// executable is found in its symbol table and released (VmRSS back within
// a tenth of the burst over its start, as checkDlopen bounds it); in a
// stripped executable (-ldflags=-s) it is reported present and not
// trimmed. A burst that jemalloc's own decay already returned (under 150
// MiB of the 500 left resident) skips: nothing to trim.
func TestStaticPrefixedJemallocInExecutable(t *testing.T) {
	t.Parallel() // child processes only
	if testing.Short() {
		t.Skip("builds a Go program and makes a 500 MiB burst")
	}
	if os.Getenv("LD_PRELOAD") != "" {
		t.Skip("LD_PRELOAD is set for the tests themselves")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skipf("needs the go command: %v", err)
	}
	dir := t.TempDir()
	buildJemalloc(t, dir, "je_", false, true)
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module jestatic\n\ngo 1.26.0\n\nrequire github.com/memctl/memctl v0.0.0\n\nreplace github.com/memctl/memctl => "+root+"\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte(staticMain), 0o644))
	for _, stripped := range []bool{false, true} {
		name := "symtab"
		if stripped {
			name = "stripped"
		}
		t.Run(name, func(t *testing.T) {
			exe := filepath.Join(dir, "jestatic-"+name)
			args := []string{"build", "-mod=mod", "-o", exe}
			if stripped {
				args = append(args, "-ldflags=-s")
			}
			build := exec.Command("go", append(args, ".")...)
			build.Dir = dir
			build.Env = append(os.Environ(), "CGO_ENABLED=1", "GOFLAGS=")
			out, err := build.CombinedOutput()
			require.NoError(t, err, "go build: %s", out)
			cmd := exec.Command(exe)
			cmd.Env = childtest.Env("", []string{"LD_PRELOAD", "MALLOC_ARENA_MAX", "GLIBC_TUNABLES", childtest.EnvVar})
			out, err = cmd.CombinedOutput()
			require.NoError(t, err, "%s", out)
			r := map[string]string{}
			for _, l := range strings.Split(string(out), "\n") {
				if k, v, ok := strings.Cut(l, "="); ok {
					r[k] = v
				}
			}
			t.Logf("%s", out)
			assert.Equal(t, "<nil>", r["ERR"])
			assert.Contains(t, r["HEAP1"], "jestatic-"+name)
			if stripped {
				assert.Contains(t, r["HEAP1"], "jemalloc (")
				assert.Contains(t, r["HEAP1"], "present, not trimmed")
			} else {
				assert.Contains(t, r["HEAP1"], "jemalloc (prefix je_)")
				assert.Contains(t, r["HEAP1_NOTE"], "symbol table")
			}
			start, after := mib(t, r, "RSS_START"), mib(t, r, "RSS_AFTER")
			burst := mib(t, r, "RSS_BURST") - start
			if burst <= 150 {
				t.Skipf("the freed burst left only %.0f MiB resident in the static jemalloc (RSS %.1f MiB at start; its own decay returned the rest while a loaded machine made it slowly): nothing to trim", burst, start)
			}
			if stripped {
				assert.Greater(t, after, 150.0, "nothing could release it")
				return
			}
			assert.Less(t, after, max(start+0.1*burst, 30), "released: back within a tenth of the burst, or under 30 MiB (the first bound)")
		})
	}
}
