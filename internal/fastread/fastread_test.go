package fastread

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

func TestRead(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("Linux only")
	}
	dir := t.TempDir()
	name := filepath.Join(dir, "f")
	want := strings.Repeat("0123456789", 1000)
	if err := os.WriteFile(name, []byte(want), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := NewPath(name)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 0, 16)
	buf, err = Read(p, buf, 1<<20)
	if err != nil || string(buf) != want {
		t.Fatalf("Read: %d bytes, %v", len(buf), err)
	}
	if allocs := testing.AllocsPerRun(10, func() { buf, _ = Read(p, buf, 1<<20) }); allocs != 0 {
		t.Errorf("%v allocations a Read once the buffer is large enough", allocs)
	}
	if _, err := Read(p, buf, len(want)-1); !errors.Is(err, ErrTooLarge) {
		t.Errorf("a file over max: %v, want ErrTooLarge", err)
	}
	if _, err := Read(p, buf, len(want)); err != nil {
		t.Errorf("a file of exactly max bytes: %v", err)
	}
	gone, _ := NewPath(filepath.Join(dir, "gone"))
	if _, err := Read(gone, buf, 10); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("an absent file: %v, want fs.ErrNotExist", err)
	}
	if _, err := Read(Path{}, buf, 10); err == nil {
		t.Error("the zero Path read without error")
	}
	if _, err := NewPath("a\x00b"); err == nil {
		t.Error("a name with a NUL accepted")
	}
}
