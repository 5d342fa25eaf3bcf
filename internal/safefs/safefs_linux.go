package safefs

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// useOpenat2 is false in tests of the walk.
var useOpenat2 = true

// OpenDir opens the directory path (following symlinks: path is the
// caller's, such as "/proc/1234") as a Dir that resolves names with mode.
// The error is a *PathError.
func OpenDir(path string, mode Mode) (*Dir, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &PathError{Op: "open", Path: path, Err: err}
	}
	return &Dir{fd: fd, name: path, mode: mode}, nil
}

// Sub opens the directory name of d as a Dir with mode, following name
// itself if it is a (magic) link: Sub("root") of a /proc/PID Dir is the
// process's root. name must be the caller's fixed name. The new Dir has d's
// Timeout and FSTypes and is closed apart from d.
func (d *Dir) Sub(name string, mode Mode) (*Dir, error) {
	return do(d, "open", name, func(dirfd int) (*Dir, error) {
		fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, &PathError{Op: "open", Path: d.join(name), Err: err}
		}
		return &Dir{fd: fd, name: d.join(name), mode: mode, Timeout: d.Timeout, FSTypes: d.FSTypes}, nil
	})
}

// Close closes the Dir.
func (d *Dir) Close() error { return unix.Close(d.fd) }

func dup(fd int) (int, error) { return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0) }

func closeFD(fd int) { unix.Close(fd) }

// resolve returns the openat2 RESOLVE_* flags of mode.
func resolve(mode Mode) uint64 {
	r := uint64(unix.RESOLVE_NO_MAGICLINKS)
	if mode&InRoot != 0 {
		r |= unix.RESOLVE_IN_ROOT
	} else {
		r |= unix.RESOLVE_BENEATH
	}
	if mode&NoSymlinks != 0 {
		r |= unix.RESOLVE_NO_SYMLINKS
	}
	return r
}

// open opens name under dirfd with flags and d's rules.
func open(dirfd int, d *Dir, name string, flags int) (int, error) {
	rel := strings.TrimLeft(name, "/")
	if rel == "" {
		rel = "."
	}
	flags |= unix.O_CLOEXEC
	if flags&unix.O_PATH == 0 {
		flags |= unix.O_NOCTTY // openat2 refuses O_PATH with other flags
	}
	if useOpenat2 {
		how := unix.OpenHow{Flags: uint64(flags), Resolve: resolve(d.mode)}
		for try := 0; ; try++ {
			fd, err := unix.Openat2(dirfd, rel, &how)
			// EAGAIN: a rename or mount raced with RESOLVE_IN_ROOT or
			// RESOLVE_BENEATH (openat2(2)); a few retries, then give up.
			if (err == unix.EINTR || err == unix.EAGAIN) && try < 16 {
				continue
			}
			// ENOSYS: before Linux 5.6. EPERM: a seccomp filter that
			// predates openat2 (Docker's default before 20.10). The walk
			// is stricter, so falling back on a real EPERM is harmless.
			if err != unix.ENOSYS && err != unix.EPERM {
				return fd, wrapErrno(err)
			}
			break
		}
	}
	return walk(dirfd, rel, flags)
}

// walk opens rel under dirfd one component at a time with O_NOFOLLOW,
// refusing every symlink and "..": the fallback without openat2.
func walk(dirfd int, rel string, flags int) (int, error) {
	parts := slices.DeleteFunc(strings.Split(rel, "/"), func(p string) bool { return p == "" || p == "." })
	if len(parts) == 0 {
		parts = []string{"."}
	}
	if slices.Contains(parts, "..") {
		return -1, fmt.Errorf("\"..\" refused: %w", unix.EXDEV)
	}
	cur := dirfd // opened here once it is not dirfd
	for i, p := range parts {
		f := unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
		if i == len(parts)-1 {
			f = flags | unix.O_NOFOLLOW
		}
		fd, err := unix.Openat(cur, p, f, 0)
		if err == unix.ENOTDIR || err == unix.ELOOP {
			var st unix.Stat_t
			if unix.Fstatat(cur, p, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
				err = unix.ELOOP
			}
		}
		if cur != dirfd {
			unix.Close(cur)
		}
		if err != nil {
			return -1, wrapErrno(err)
		}
		cur = fd
	}
	return cur, nil
}

// wrapErrno makes ELOOP (a refused symlink) match ErrSymlink.
func wrapErrno(err error) error {
	if errors.Is(err, unix.ELOOP) {
		return fmt.Errorf("%w (%w)", ErrSymlink, err)
	}
	return err
}

// openRegular opens name for reading if it is a regular file on one of
// d.FSTypes, checked on an O_PATH descriptor first (see the package doc).
func openRegular(dirfd int, d *Dir, name string) (*os.File, error) {
	pfd, err := open(dirfd, d, name, unix.O_PATH)
	if err != nil {
		return nil, &PathError{Op: "open", Path: d.join(name), Err: err}
	}
	f, _, err := reopenRegular(pfd, d.join(name), d.FSTypes)
	return f, err
}

// reopenRegular closes the O_PATH descriptor pfd and opens its file for
// reading, through its /proc/self/fd link (openat(2) takes no
// AT_EMPTY_PATH), if it is a regular file on one of fsTypes (any when
// empty). It returns the file's size from fstat(2).
func reopenRegular(pfd int, path string, fsTypes []int64) (*os.File, int64, error) {
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return nil, 0, &PathError{Op: "fstat", Path: path, Err: err}
	}
	switch t := st.Mode & unix.S_IFMT; t {
	case unix.S_IFREG:
	case unix.S_IFLNK: // the walk's O_PATH|O_NOFOLLOW opens the link itself
		return nil, 0, &PathError{Op: "open", Path: path, Err: wrapErrno(unix.ELOOP)}
	default:
		return nil, 0, &PathError{Op: "open", Path: path, Err: fmt.Errorf("%w: %s", ErrNotRegular, fileType(t))}
	}
	if err := fsCheck(pfd, fsTypes); err != nil {
		return nil, 0, &PathError{Op: "open", Path: path, Err: err}
	}
	for {
		fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(pfd), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
		if err == nil {
			return os.NewFile(uintptr(fd), path), st.Size, nil
		}
		if err != unix.EINTR {
			return nil, 0, &PathError{Op: "open", Path: path, Err: err}
		}
	}
}

func readFile(dirfd int, d *Dir, name string, max int64) ([]byte, error) {
	f, err := openRegular(dirfd, d, name)
	if err != nil {
		return nil, err
	}
	return readAll(f, max)
}

// readAll reads f to its end and closes it: at most max bytes, else an
// error matching ErrTooLarge.
func readAll(f *os.File, max int64) ([]byte, error) {
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, readError(f.Name(), err)
	}
	if int64(len(b)) > max {
		return nil, &PathError{Op: "read", Path: f.Name(), Err: fmt.Errorf("%w of %d bytes", ErrTooLarge, max)}
	}
	return b, nil
}

// readError is the *PathError of err, an error of a read of path.
func readError(path string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return &PathError{Op: "read", Path: path, Err: err}
}

func scanLines(dirfd int, d *Dir, name string, max int64, each func([]byte) error) error {
	f, err := openRegular(dirfd, d, name)
	if err != nil {
		return err
	}
	defer f.Close()
	r := &io.LimitedReader{R: f, N: max + 1} // N 0: over max
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), MaxLine)
	for sc.Scan() && r.N > 0 {
		if err := each(sc.Bytes()); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return readError(f.Name(), err)
	}
	if r.N == 0 {
		return &PathError{Op: "read", Path: f.Name(), Err: fmt.Errorf("%w of %d bytes", ErrTooLarge, max)}
	}
	return nil
}

func statDir(dirfd int, d *Dir, name string) error {
	fd, err := open(dirfd, d, name, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return &PathError{Op: "open", Path: d.join(name), Err: err}
	}
	defer unix.Close(fd)
	if err := fsCheck(fd, d.FSTypes); err != nil {
		return &PathError{Op: "open", Path: d.join(name), Err: err}
	}
	return nil
}

// fsCheck returns nil when fd's file system is one of want, or want is empty.
func fsCheck(fd int, want []int64) error {
	if len(want) == 0 {
		return nil
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return err
	}
	return checkFS(int64(fs.Type), want)
}

// Readlink returns the target of the symlink name in d, a name the caller
// fixed (such as "ns/mnt" of a /proc/PID Dir).
func (d *Dir) Readlink(name string) (string, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Readlinkat(d.fd, name, buf)
		if err != nil {
			return "", &PathError{Op: "readlink", Path: d.join(name), Err: err}
		}
		if n < len(buf) {
			return string(buf[:n]), nil
		}
		buf = make([]byte, 2*len(buf))
	}
}

// ReadMemfd finds the first descriptor of the process (d is its /proc/PID)
// whose link reads "/memfd:NAME (deleted)" and returns its path
// ("/proc/PID/fd/N") and content, at most max bytes (a longer file is not
// read: ErrTooLarge). It is opened with O_PATH and read only if it is a
// regular tmpfs or hugetlbfs file (ErrNotRegular, ErrFileSystem) sealed
// against writes, growth and shrinking (ErrNotSealed), so a descriptor
// swapped after the readlink is refused. At most MaxFDs descriptors are
// looked at (then ErrTooLarge); none found matches fs.ErrNotExist.
func (d *Dir) ReadMemfd(name string, max int64) (path string, b []byte, err error) {
	r, err := do(d, "open", "fd", func(dirfd int) (memfd, error) { return readMemfd(dirfd, d, name, max) })
	return r.path, r.b, err
}

// MaxFDs is the most entries of /proc/PID/fd that ReadMemfd looks at (a
// process may hold RLIMIT_NOFILE, often 1048576, and each is a readlink).
const MaxFDs = 1 << 16

// maxFDs is MaxFDs; tests lower it.
var maxFDs = MaxFDs

// Magic numbers of the file systems a memfd lives on (linux/magic.h).
const (
	TmpfsMagic     = 0x01021994
	HugetlbfsMagic = 0x958458f6
)

// memfd is what ReadMemfd returns.
type memfd struct {
	path string
	b    []byte
}

func readMemfd(dirfd int, d *Dir, name string, max int64) (memfd, error) {
	dir := d.join("fd")
	dfd, err := unix.Openat(dirfd, "fd", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return memfd{}, &PathError{Op: "open", Path: dir, Err: wrapErrno(err)}
	}
	f := os.NewFile(uintptr(dfd), dir)
	defer f.Close()
	want := "/memfd:" + name + " (deleted)"
	link := make([]byte, len(want)+1)
	seen := 0
	for {
		names, err := f.Readdirnames(256)
		for _, fdName := range names {
			if seen++; seen > maxFDs {
				return memfd{}, &PathError{Op: "read", Path: dir, Err: fmt.Errorf("%w: more than %d descriptors", ErrTooLarge, maxFDs)}
			}
			m, err := unix.Readlinkat(dfd, fdName, link)
			if err != nil || string(link[:m]) != want {
				continue // closed meanwhile, or another file
			}
			path := dir + "/" + fdName
			b, err := readMagic(dfd, fdName, path, max)
			return memfd{path, b}, err
		}
		if err == io.EOF {
			return memfd{}, &PathError{Op: "open", Path: d.join("fd/(memfd:" + name + ")"), Err: fs.ErrNotExist}
		}
		if err != nil {
			return memfd{}, readError(dir, err)
		}
	}
}

// readMagic reads the file of the magic link name in dfd with ReadMemfd's checks.
func readMagic(dfd int, name, path string, max int64) ([]byte, error) {
	pfd, err := unix.Openat(dfd, name, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &PathError{Op: "open", Path: path, Err: wrapErrno(err)}
	}
	f, size, err := reopenRegular(pfd, path, []int64{TmpfsMagic, HugetlbfsMagic})
	if err != nil {
		return nil, err
	}
	if size > max {
		f.Close()
		return nil, &PathError{Op: "read", Path: path, Err: fmt.Errorf("%w of %d bytes (%d bytes)", ErrTooLarge, max, size)}
	}
	// Sealed: its content cannot change while it is read, whatever the
	// process does meanwhile (a plain tmpfs file has F_SEAL_SEAL alone).
	const want = unix.F_SEAL_WRITE | unix.F_SEAL_GROW | unix.F_SEAL_SHRINK
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil || seals&want != want {
		f.Close()
		why := fmt.Errorf("%w: seals %#x, want %#x", ErrNotSealed, seals, want)
		if err != nil {
			why = fmt.Errorf("%w: F_GET_SEALS: %w", ErrNotSealed, err)
		}
		return nil, &PathError{Op: "open", Path: path, Err: why}
	}
	return readAll(f, max)
}

func subDirs(dirfd int, d *Dir, name string, max int) ([]string, error) {
	path := d.join(name)
	fd, err := open(dirfd, d, name, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, &PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	if err := fsCheck(fd, d.FSTypes); err != nil {
		return nil, &PathError{Op: "open", Path: path, Err: err}
	}
	var out []string
	for {
		// d_type (cgroupfs and tmpfs fill it in); unknown is left out.
		ents, err := f.ReadDir(256)
		for _, e := range ents {
			if !e.IsDir() {
				continue
			}
			if len(out) == max {
				return nil, &PathError{Op: "readdir", Path: path, Err: fmt.Errorf("%w: more than %d directories", ErrTooLarge, max)}
			}
			out = append(out, e.Name())
		}
		if errors.Is(err, io.EOF) || (err == nil && len(ents) == 0) {
			return out, nil
		}
		if err != nil {
			return nil, &PathError{Op: "readdir", Path: path, Err: err}
		}
	}
}
