package main

import (
	"errors"
	"io/fs"
	"strings"
	"syscall"
)

// defaultPath is the search path when PATH is unset: glibc's execvp(3)
// uses confstr(_CS_PATH), "/bin:/usr/bin".
const defaultPath = "/bin:/usr/bin"

// errNotFound is the error of a PROGRAM found in no directory of PATH.
var errNotFound = errors.New("executable file not found in $PATH")

// nameMax is NAME_MAX, the longest file name execvp(3) searches PATH for.
const nameMax = 255

// errNameTooLong is the error of a PROGRAM name longer than nameMax
// without a slash: execvp(3) fails with ENAMETOOLONG, env(1) exits 126.
var errNameTooLong = errors.New("file name too long")

// lookPath returns the files exec tries for file, in order, as env(1) and
// execvp(3) do: file itself when it holds a slash; otherwise file in each
// directory of path (pathSet false: defaultPath), where an empty entry and
// "." mean the current directory (exec.LookPath refuses those with
// exec.ErrDot; env(1) runs them). Each candidate is the PATH entry, a slash
// and file, as execvp builds it (not cleaned: "/a/../b" goes through /a,
// which may be a symlink, as the kernel resolves it). A candidate is left
// out only when it does not exist (ENOENT, ENOTDIR) or is a directory;
// whether it can be executed is execve(2)'s to say (a denied search
// permission, a symlink loop), and exec moves on to the next on EACCES,
// ENOENT or ENOTDIR as execvp does. The error is errNotFound (also for an
// empty file, as execvp), errNameTooLong for a name over NAME_MAX, or
// matches fs.ErrPermission when the only matches are directories (execvp
// gives EACCES there).
func lookPath(file, path string, pathSet bool, stat func(string) (fs.FileInfo, error)) ([]string, error) {
	if strings.Contains(file, "/") {
		return []string{file}, nil
	}
	if file == "" {
		return nil, errNotFound
	}
	if len(file) > nameMax {
		return nil, errNameTooLong
	}
	if !pathSet {
		path = defaultPath
	}
	var found []string
	dir := false
	for _, d := range strings.Split(path, ":") {
		if d == "" {
			d = "." // found through "." or an empty entry
		}
		p := d + "/" + file
		fi, err := stat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR):
		case err != nil:
			found = append(found, p) // execve(2) says why
		case fi.IsDir():
			dir = true
		default:
			found = append(found, p)
		}
	}
	if len(found) == 0 && dir {
		return nil, fs.ErrPermission
	}
	if len(found) == 0 {
		return nil, errNotFound
	}
	return found, nil
}
