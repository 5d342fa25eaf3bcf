package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"syscall"

	"github.com/memctl/memctl/thp"
)

// execProgram applies cfg and replaces memctl with args[0]. It returns only
// on error, with the exit status.
func execProgram(cfg execConfig, args []string, stderr io.Writer) int {
	path, err := exec.LookPath(args[0])
	if err != nil {
		fmt.Fprintf(stderr, "memctl: %v\n", err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			return exitNotFound
		}
		return exitNoExec
	}
	verbose := func(format string, a ...any) {
		if cfg.verbose {
			fmt.Fprintf(stderr, "memctl: "+format+"\n", a...)
		}
	}
	env := os.Environ()
	if memctlOff() {
		verbose("MEMCTL=off: nothing changed")
	} else {
		st, err := cfg.thp.Apply()
		if err != nil {
			if cfg.thp == thp.PolicyExceptAdvised && errors.Is(err, errors.ErrUnsupported) {
				err = fmt.Errorf("%w; use -thp=disable on this kernel", err)
			}
			fmt.Fprintf(stderr, "memctl: -thp=%s: %v\n", cfg.thp, err)
			return exitError
		}
		verbose("THP %s (-thp=%s)", st, cfg.thp)
		ml, err := memLimit(cfg)
		if err != nil {
			fmt.Fprintf(stderr, "memctl: GOMEMLIMIT: %v\n", err)
			return exitError
		}
		var notes []string
		env, notes = prepareEnv(env, cfg, ml)
		for _, n := range notes {
			verbose("%s", n)
		}
	}
	verbose("exec %s", path)
	err = syscall.Exec(path, args, env)
	fmt.Fprintf(stderr, "memctl: exec %s: %v\n", path, err)
	if errors.Is(err, syscall.ENOENT) {
		return exitNotFound // for example a script whose interpreter is missing
	}
	return exitNoExec
}
