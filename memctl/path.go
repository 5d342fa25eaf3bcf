package main

import (
	"errors"
	"io/fs"
	"path/filepath"
	"strings"
)

// defaultPath is the search path when PATH is unset: glibc's execvp(3)
// uses confstr(_CS_PATH), "/bin:/usr/bin".
const defaultPath = "/bin:/usr/bin"

// errNotFound is the error of a PROGRAM found in no directory of PATH.
var errNotFound = errors.New("executable file not found in $PATH")

// lookPath returns the files exec tries for file, in order, as env(1) and
// execvp(3) do: file itself when it holds a slash; otherwise file in each
// directory of path (pathSet false: defaultPath), where an empty entry and
// "." mean the current directory (exec.LookPath refuses those with
// exec.ErrDot; env(1) runs them). A candidate is a file that exists and is
// not a directory; whether it can be executed is execve(2)'s to say, and
// exec moves on to the next on EACCES, ENOENT or ENOTDIR as execvp does.
// The error is errNotFound, or matches fs.ErrPermission when the only
// matches are directories (execvp gives EACCES there).
func lookPath(file, path string, pathSet bool, stat func(string) (fs.FileInfo, error)) ([]string, error) {
	if strings.Contains(file, "/") {
		return []string{file}, nil
	}
	if !pathSet {
		path = defaultPath
	}
	var found []string
	dir := false
	for _, d := range strings.Split(path, ":") {
		if d == "" {
			d = "."
		}
		p := filepath.Join(d, file)
		if !strings.Contains(p, "/") {
			p = "./" + p // found through "." or an empty entry
		}
		fi, err := stat(p)
		switch {
		case err != nil:
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
