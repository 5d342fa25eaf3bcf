package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"syscall"

	"github.com/memctl/memctl/limits"
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
	if cfg.off {
		verbose("MEMCTL=%s: nothing changed", os.Getenv("MEMCTL"))
	} else {
		st, err := cfg.thp.Apply()
		switch {
		case err == nil:
			verbose("THP %s (%s)", st, cfg.thpFrom)
		case cfg.thpEnv:
			// The operator's environment, not this command line, asked:
			// as memctl.Start does, report it and run the program.
			fmt.Fprintf(stderr, "memctl: warning: %s: %v; THP flag left as inherited\n", cfg.thpFrom, err)
		default:
			if cfg.thp == thp.PolicyExceptAdvised && errors.Is(err, errors.ErrUnsupported) {
				err = fmt.Errorf("%w; use -thp=disable on this kernel", err)
			}
			fmt.Fprintf(stderr, "memctl: -thp=%s: %v\n", cfg.thp, err)
			return exitError
		}
		ml, err := memLimit(cfg)
		if err != nil {
			// A typo in AUTOMEMLIMIT or an unreadable cgroup file must not
			// stop the program from starting: it runs without GOMEMLIMIT
			// from memctl.
			fmt.Fprintf(stderr, "memctl: warning: GOMEMLIMIT not set: %v\n", err)
			ml = limits.MemLimit{Reason: err.Error()}
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
