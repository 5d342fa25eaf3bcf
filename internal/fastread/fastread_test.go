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
	f, err := New(name)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 0, 16)
	buf, err = f.Read(buf, 1<<20)
	if err != nil || string(buf) != want {
		t.Fatalf("Read: %d bytes, %v", len(buf), err)
	}
	if allocs := testing.AllocsPerRun(10, func() { buf, _ = f.Read(buf, 1<<20) }); allocs != 0 {
		t.Errorf("%v allocations a Read once the buffer is large enough", allocs)
	}
	if _, err := f.Read(buf, len(want)-1); !errors.Is(err, ErrTooLarge) {
		t.Errorf("a file over max: %v, want ErrTooLarge", err)
	}
	if _, err := f.Read(buf, len(want)); err != nil {
		t.Errorf("a file of exactly max bytes: %v", err)
	}
	if err := os.WriteFile(name, []byte("new\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if buf, err = f.Read(buf, 10); err != nil || string(buf) != "new\n" {
		t.Errorf("the file rewritten read through the kept descriptor: %q, %v", buf, err)
	}
	f.Close()
	if buf, err = f.Read(buf, 10); err != nil || string(buf) != "new\n" {
		t.Errorf("a Read after Close: %q, %v", buf, err)
	}
	gone, _ := New(filepath.Join(dir, "gone"))
	if _, err := gone.Read(buf, 10); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("an absent file: %v, want fs.ErrNotExist", err)
	}
	var zero File
	if _, err := zero.Read(buf, 10); err == nil {
		t.Error("the zero File read without error")
	}
	if _, err := New("a\x00b"); err == nil {
		t.Error("a name with a NUL accepted")
	}
}
