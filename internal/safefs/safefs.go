// Package safefs reads files that another, possibly hostile, process
// chose: its /proc/PID files and its cgroup files as its mount namespace
// shows them (memctl status runs as root on such processes). In place of a
// cgroup file the process can put a symlink to /etc/shadow, a device, a
// FIFO that blocks the reader, or a huge file. A Dir reads safely:
//
//   - Names resolve inside the Dir (openat2(2) RESOLVE_IN_ROOT or
//     RESOLVE_BENEATH), never through a /proc magic link; with NoSymlinks,
//     through no symlink at all.
//   - Only regular files are read (ErrNotRegular): the name is opened with
//     O_PATH, which runs no driver's open(2) and releases no writer blocked
//     on a FIFO, then checked with fstat(2) and fstatfs(2) and reopened for
//     reading through /proc/self/fd with O_NONBLOCK and O_NOCTTY.
//   - With Dir.FSTypes, only files of the listed file systems are read
//     (ErrFileSystem): only that tells a bind-mounted /etc/shadow from a
//     cgroup file.
//   - A file longer than the caller's cap is an error (ErrTooLarge), never
//     a truncated value; with Dir.Timeout, a read not done in time (a FUSE
//     file the process serves) returns ErrTimeout.
//
// Without openat2 (before Linux 5.6, or EPERM from an old seccomp filter)
// a name is walked one component at a time with O_PATH|O_NOFOLLOW,
// refusing every symlink and "..". Show every string another process
// supplies through Quote. A Dir is safe for concurrent use; Close it when
// done.
package safefs

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Caps on the bytes read from one file. Mountinfo is about 150-300 bytes a
// mount, up to mount.max (100000 by default, proc_sys_fs(5)), streamed: its
// cap bounds time. The environment is under 6 MiB (execve(2), fs/exec.c).
const (
	MaxCgroupFile = 64 << 10 // 64 KiB: a cgroup control file
	MaxProcFile   = 64 << 10 // 64 KiB: /proc/PID/status, smaps_rollup, stat, cgroup
	MaxMountinfo  = 32 << 20 // 32 MiB: /proc/PID/mountinfo, streamed (ScanLines)
	MaxEnviron    = 6 << 20  // 6 MiB: /proc/PID/environ
)

// MaxLine is the longest line ScanLines accepts: 1 MiB, above a mountinfo
// line's most (three escaped PATH_MAX strings, about 50 KiB).
const MaxLine = 1 << 20

// MaxQuote is the most bytes of a string that Quote shows.
const MaxQuote = 200

var (
	// ErrNotRegular is matched by a read of a directory, FIFO, socket or device.
	ErrNotRegular = errors.New("not a regular file")
	// ErrTooLarge is matched by a read of a file longer than the caller's cap.
	ErrTooLarge = errors.New("file larger than the cap")
	// ErrTimeout is matched by a read not done within Dir.Timeout.
	ErrTimeout = errors.New("read timed out")
	// ErrFileSystem is matched by a read on a file system not in Dir.FSTypes.
	ErrFileSystem = errors.New("file system refused")
	// ErrSymlink is matched by the error of an open that met a symlink the
	// Dir refuses (NoSymlinks, a magic link, or any symlink on a kernel
	// without openat2). The kernel's ELOOP is wrapped.
	ErrSymlink = errors.New("symlink refused")
	// ErrNotSealed is matched by the error of ReadMemfd for a file not
	// sealed with F_SEAL_WRITE, F_SEAL_GROW and F_SEAL_SHRINK, as the
	// library seals its record.
	ErrNotSealed = errors.New("not a sealed memfd")
)

// Mode says how a Dir resolves names.
type Mode int

const (
	// InRoot resolves names as if the Dir were the root directory: an
	// absolute symlink or ".." stops at the Dir (RESOLVE_IN_ROOT). Without
	// it, a name that would leave the Dir is an error (RESOLVE_BENEATH).
	InRoot Mode = 1 << iota
	// NoSymlinks refuses every symlink on the way (RESOLVE_NO_SYMLINKS).
	// Magic links (/proc/PID/fd/N, /proc/PID/root) are always refused.
	NoSymlinks
)

// PathError is the error of an operation on a file of a Dir. Its message
// quotes Path with Quote, since Path may hold names the other process chose.
type PathError struct {
	Op   string // "open", "read", "fstat"
	Path string // the Dir's name joined with the file's name
	Err  error
}

func (e *PathError) Error() string { return e.Op + " " + Quote(e.Path) + ": " + e.Err.Error() }
func (e *PathError) Unwrap() error { return e.Err }

// Quote returns s as a Go string literal (strconv.Quote: invalid UTF-8 and
// unprintable runes such as ESC or a bidi override are escaped), cut to its
// first MaxQuote bytes and then followed by "...(N bytes)".
func Quote(s string) string {
	if len(s) <= MaxQuote {
		return strconv.Quote(s)
	}
	// Cut at a rune boundary.
	n := MaxQuote
	for i := 1; i < utf8.UTFMax && n > 0 && !utf8.RuneStart(s[n]); i++ {
		n--
	}
	cut := s[:n]
	return strconv.Quote(cut) + "...(" + strconv.Itoa(len(s)) + " bytes)"
}

// fileType names st_mode & S_IFMT for ErrNotRegular.
func fileType(ifmt uint32) string {
	name, ok := map[uint32]string{0o010000: "a FIFO", 0o020000: "a character device", 0o040000: "a directory",
		0o060000: "a block device", 0o120000: "a symlink", 0o140000: "a socket"}[ifmt]
	if !ok {
		return "type " + strconv.FormatUint(uint64(ifmt), 8)
	}
	return name
}

// Dir is an open directory names resolve in (see the package doc); make one
// with OpenDir or Dir.Sub.
type Dir struct {
	fd   int
	name string
	mode Mode
	// Timeout, when positive, bounds each read: the call then returns an
	// error matching ErrTimeout and the blocked read goes on in its own
	// goroutine. Zero means no bound. Set it before using the Dir.
	Timeout time.Duration
	// FSTypes, when not empty, lists the only file systems (statfs(2)
	// f_type, such as Cgroup2Magic) whose files are accepted; others are
	// refused with ErrFileSystem. Set it before using the Dir.
	FSTypes []int64
}

// Magic numbers of file systems (statfs(2) f_type, linux/magic.h).
const (
	CgroupMagic  = 0x27e0eb
	Cgroup2Magic = 0x63677270
	ProcMagic    = 0x9fa0
)

// fsName names the file system type t for ErrFileSystem.
func fsName(t int64) string {
	name := map[int64]string{
		CgroupMagic: "cgroup", Cgroup2Magic: "cgroup2", ProcMagic: "proc",
		0x01021994: "tmpfs", 0x62656572: "sysfs", 0xef53: "ext4", 0x794c7630: "overlay",
		0x65735546: "fuse", 0x58465342: "xfs", 0x9123683e: "btrfs", 0x1373: "devtmpfs",
	}[t]
	if name == "" {
		return fmt.Sprintf("type 0x%x", t)
	}
	return fmt.Sprintf("%s (0x%x)", name, t)
}

// checkFS returns nil when t is one of want (or want is empty).
func checkFS(t int64, want []int64) error {
	if len(want) == 0 || slices.Contains(want, t) {
		return nil
	}
	names := make([]string, len(want))
	for i, w := range want {
		names[i] = fsName(w)
	}
	return fmt.Errorf("%w: %s, not %s", ErrFileSystem, fsName(t), strings.Join(names, " or "))
}

// Name returns the path the Dir was opened with, for messages.
func (d *Dir) Name() string { return d.name }

// join returns the Dir's name joined with name, for messages.
func (d *Dir) join(name string) string {
	if d.name == "/" && strings.HasPrefix(name, "/") {
		return name
	}
	return strings.TrimSuffix(d.name, "/") + "/" + strings.TrimPrefix(name, "/")
}

// do runs f on d's fd, or with d.Timeout in a goroutine on a dup of it, so
// a Close while f is blocked cannot make f resolve names in a reused fd.
// After a timeout f's result is dropped.
func do[T any](d *Dir, op, name string, f func(dirfd int) (T, error)) (T, error) {
	var zero T
	if d.Timeout <= 0 {
		return f(d.fd)
	}
	fd, err := dup(d.fd)
	if err != nil {
		return zero, &PathError{Op: op, Path: d.join(name), Err: err}
	}
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		defer closeFD(fd)
		v, err := f(fd)
		ch <- result{v, err}
	}()
	t := time.NewTimer(d.Timeout)
	defer t.Stop()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-t.C:
		return zero, &PathError{Op: op, Path: d.join(name), Err: fmt.Errorf("%w after %v", ErrTimeout, d.Timeout)}
	}
}

// ReadFile reads the regular file name, resolved in d, and returns its
// content: at most max bytes, or an error matching ErrTooLarge when the file
// is longer. The error is a *PathError; it matches ErrNotRegular for a file
// that is not regular, ErrSymlink for a symlink d refuses, ErrTimeout (see
// Timeout), and the kernel's errno otherwise (fs.ErrNotExist for ENOENT,
// fs.ErrPermission for EACCES).
func (d *Dir) ReadFile(name string, max int64) ([]byte, error) {
	return do(d, "read", name, func(dirfd int) ([]byte, error) { return readFile(dirfd, d, name, max) })
}

// ScanLines calls each with every line of the regular file name (resolved
// as by ReadFile), without its newline, and returns the first error each
// returns, as it is. The file is streamed; after max bytes the error
// matches ErrTooLarge, and a line is at most MaxLine bytes. Other errors
// are *PathError. The line is valid only during the call. With Timeout set,
// each may still be running after ErrTimeout: it must write only state the
// caller leaves alone when ScanLines fails.
func (d *Dir) ScanLines(name string, max int64, each func(line []byte) error) error {
	_, err := do(d, "read", name, func(dirfd int) (struct{}, error) {
		return struct{}{}, scanLines(dirfd, d, name, max, each)
	})
	return err
}

// Stat returns nil when name, resolved in d, is a directory, and the error
// of the open otherwise (ENOTDIR when it is not a directory).
func (d *Dir) Stat(name string) error {
	_, err := do(d, "open", name, func(dirfd int) (struct{}, error) { return struct{}{}, statDir(dirfd, d, name) })
	return err
}

// SubDirs returns the names of the subdirectories of name (resolved as by
// Stat), in directory order; more than max is an error matching
// ErrTooLarge. The error is a *PathError.
func (d *Dir) SubDirs(name string, max int) ([]string, error) {
	return do(d, "readdir", name, func(dirfd int) ([]string, error) { return subDirs(dirfd, d, name, max) })
}
