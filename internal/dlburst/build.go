//go:build linux && cgo

package dlburst

import (
	"os"
	"os/exec"
	"testing"
)

// HiddenJemalloc is the C source of a library that carries a hidden copy of
// jemalloc as memctl's scan sees one: jemalloc's messages and none of its
// entry points. The marker is split in two C string literals, so that a
// binary holding this Go string does not read as a copy itself.
const HiddenJemalloc = `__attribute__((used)) const char hidden21_msg[] = "<jemalloc" ">: hidden copy";` + "\n"

// Build compiles the C source into the shared library so (gcc -shared
// -fPIC, then flags), failing t with gcc's output when it does not build,
// and skipping t when gcc is missing. The source is written beside so.
func Build(t testing.TB, so, source string, flags ...string) {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skipf("needs gcc to build a library to load: %v", err)
	}
	src := so + ".c"
	if err := os.WriteFile(src, []byte(source), 0o644); err != nil {
		t.Fatalf("dlburst: %v", err)
	}
	args := append(append([]string{"-shared", "-fPIC"}, flags...), "-o", so, src)
	if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
		t.Fatalf("dlburst: gcc %v: %v\n%s", args, err, out)
	}
}
