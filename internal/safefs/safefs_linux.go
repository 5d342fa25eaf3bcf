package safefs

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
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
	var sub *Dir
	_, err := d.do("open", name, func(dirfd int) ([]byte, error) {
		fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, &PathError{Op: "open", Path: d.join(name), Err: err}
		}
		sub = &Dir{fd: fd, name: d.join(name), mode: mode, Timeout: d.Timeout, FSTypes: d.FSTypes}
		return nil, nil
	})
	if err != nil {
		return nil, err
	}
	return sub, nil
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
	var parts []string
	for _, p := range strings.Split(rel, "/") {
		if p != "" && p != "." {
			parts = append(parts, p)
		}
	}
	if len(parts) == 0 {
		parts = []string{"."}
	}
	cur, owned := dirfd, false
	defer func() {
		if owned {
			unix.Close(cur)
		}
	}()
	for i, p := range parts {
		if p == ".." {
			return -1, fmt.Errorf("\"..\" refused: %w", unix.EXDEV)
		}
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
		if err != nil {
			return -1, wrapErrno(err)
		}
		if owned {
			unix.Close(cur)
		}
		cur = fd
		owned = true
	}
	owned = false
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
func openRegular(dirfd int, d *Dir, name string) (int, error) {
	path := d.join(name)
	pfd, err := open(dirfd, d, name, unix.O_PATH)
	if err != nil {
		return -1, &PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return -1, &PathError{Op: "fstat", Path: path, Err: err}
	}
	switch t := st.Mode & unix.S_IFMT; t {
	case unix.S_IFREG:
	case unix.S_IFLNK: // the walk's O_PATH|O_NOFOLLOW opens the link itself
		return -1, &PathError{Op: "open", Path: path, Err: wrapErrno(unix.ELOOP)}
	default:
		return -1, &PathError{Op: "open", Path: path, Err: fmt.Errorf("%w: %s", ErrNotRegular, fileType(t))}
	}
	if err := fsCheck(pfd, d.FSTypes); err != nil {
		return -1, &PathError{Op: "open", Path: path, Err: err}
	}
	fd, err := reopen(pfd, unix.O_RDONLY|unix.O_NONBLOCK)
	if err != nil {
		return -1, &PathError{Op: "open", Path: path, Err: err}
	}
	return fd, nil
}

func readFile(dirfd int, d *Dir, name string, max int64) ([]byte, error) {
	path := d.join(name)
	fd, err := openRegular(dirfd, d, name)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return readFD(fd, path, max)
}

// readFD reads fd to its end, at most max bytes (else ErrTooLarge).
func readFD(fd int, path string, max int64) ([]byte, error) {
	buf := make([]byte, 0, min(max+1, 4096))
	for int64(len(buf)) <= max {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		end := min(int64(cap(buf)), max+1)
		n, err := unix.Read(fd, buf[len(buf):end])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &PathError{Op: "read", Path: path, Err: err}
		}
		if n == 0 {
			return buf, nil
		}
		buf = buf[:len(buf)+n]
	}
	return nil, &PathError{Op: "read", Path: path, Err: fmt.Errorf("%w of %d bytes", ErrTooLarge, max)}
}

// fdReader reads a descriptor, counting the bytes read.
type fdReader struct {
	fd int
	n  int64
}

func (r *fdReader) Read(p []byte) (int, error) {
	for {
		n, err := unix.Read(r.fd, p)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return 0, err
		case n == 0:
			return 0, io.EOF
		}
		r.n += int64(n)
		return n, nil
	}
}

func scanLines(dirfd int, d *Dir, name string, max int64, each func([]byte) error) error {
	path := d.join(name)
	fd, err := openRegular(dirfd, d, name)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	r := &fdReader{fd: fd}
	tooLarge := &PathError{Op: "read", Path: path, Err: fmt.Errorf("%w of %d bytes", ErrTooLarge, max)}
	sc := bufio.NewScanner(io.LimitReader(r, max+1))
	sc.Buffer(make([]byte, 0, 4096), MaxLine)
	for sc.Scan() {
		if r.n > max {
			return tooLarge
		}
		if err := each(sc.Bytes()); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return &PathError{Op: "read", Path: path, Err: err}
	}
	if r.n > max {
		return tooLarge
	}
	return nil
}

// reopen opens the file of the O_PATH descriptor pfd through its
// /proc/self/fd link (openat(2) takes no AT_EMPTY_PATH).
func reopen(pfd, flags int) (int, error) {
	for {
		fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(pfd), flags|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
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
	_, err = d.do("open", "fd", func(dirfd int) ([]byte, error) {
		path, b, err = readMemfd(dirfd, d, name, max)
		return nil, err
	})
	return path, b, err
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

func readMemfd(dirfd int, d *Dir, name string, max int64) (string, []byte, error) {
	dir := d.join("fd")
	dfd, err := unix.Openat(dirfd, "fd", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, &PathError{Op: "open", Path: dir, Err: wrapErrno(err)}
	}
	defer unix.Close(dfd)
	want := "/memfd:" + name + " (deleted)"
	link := make([]byte, len(want)+1)
	buf := make([]byte, 8192)
	seen := 0
	for {
		n, err := unix.ReadDirent(dfd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return "", nil, &PathError{Op: "read", Path: dir, Err: wrapErrno(err)}
		}
		if n == 0 {
			return "", nil, &PathError{Op: "open", Path: d.join("fd/(memfd:" + name + ")"), Err: fs.ErrNotExist}
		}
		var names []string
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
		for _, fdName := range names {
			if seen++; seen > maxFDs {
				return "", nil, &PathError{Op: "read", Path: dir, Err: fmt.Errorf("%w: more than %d descriptors", ErrTooLarge, maxFDs)}
			}
			m, err := unix.Readlinkat(dfd, fdName, link)
			if err != nil || string(link[:m]) != want {
				continue // closed meanwhile, or another file
			}
			path := dir + "/" + fdName
			b, err := readMagic(dfd, fdName, path, max)
			return path, b, err
		}
	}
}

// readMagic reads the file of the magic link name in dfd with ReadMemfd's checks.
func readMagic(dfd int, name, path string, max int64) ([]byte, error) {
	pfd, err := unix.Openat(dfd, name, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &PathError{Op: "open", Path: path, Err: wrapErrno(err)}
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return nil, &PathError{Op: "fstat", Path: path, Err: err}
	}
	if t := st.Mode & unix.S_IFMT; t != unix.S_IFREG {
		return nil, &PathError{Op: "open", Path: path, Err: fmt.Errorf("%w: %s", ErrNotRegular, fileType(t))}
	}
	if err := fsCheck(pfd, []int64{TmpfsMagic, HugetlbfsMagic}); err != nil {
		return nil, &PathError{Op: "open", Path: path, Err: err}
	}
	if st.Size > max {
		return nil, &PathError{Op: "read", Path: path, Err: fmt.Errorf("%w of %d bytes (%d bytes)", ErrTooLarge, max, st.Size)}
	}
	fd, err := reopen(pfd, unix.O_RDONLY|unix.O_NONBLOCK)
	if err != nil {
		return nil, &PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	// Sealed: its content cannot change while it is read, whatever the
	// process does meanwhile (a plain tmpfs file has F_SEAL_SEAL alone).
	const want = unix.F_SEAL_WRITE | unix.F_SEAL_GROW | unix.F_SEAL_SHRINK
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&want != want {
		why := fmt.Errorf("%w: seals %#x, want %#x", ErrNotSealed, seals, want)
		if err != nil {
			why = fmt.Errorf("%w: F_GET_SEALS: %w", ErrNotSealed, err)
		}
		return nil, &PathError{Op: "open", Path: path, Err: why}
	}
	return readFD(fd, path, max)
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
