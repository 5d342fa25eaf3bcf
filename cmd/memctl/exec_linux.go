package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/memctl/memctl/limits"
	"github.com/memctl/memctl/thp"
)

// execProgram applies cfg and execs args[0]; it returns only on error.
func execProgram(cfg execConfig, args []string, stderr io.Writer) int {
	path, pathSet := os.LookupEnv("PATH")
	paths, err := lookPath(args[0], path, pathSet, os.Stat)
	if err != nil {
		fmt.Fprintf(stderr, "memctl: exec: %s: %v\n", strconv.Quote(args[0]), err)
		if errors.Is(err, errNotFound) {
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
			// The operator's environment asked: warn, as memctl.Start.
			fmt.Fprintf(stderr, "memctl: warning: %s: %v; THP flag left as inherited\n", cfg.thpFrom, err)
		default:
			if cfg.thp == thp.PolicyExceptAdvised && errors.Is(err, errors.ErrUnsupported) {
				err = fmt.Errorf("%w; use -thp=disable on this kernel", err)
			}
			fmt.Fprintf(stderr, "memctl: -thp=%s: %v\n", cfg.thp, err)
			return exitError
		}
		// No headroom (memctl's, not the program's) and no refresh.
		ml, err := limits.SetGoMemLimit(context.Background(), limits.MemLimitConfig{Ratio: cfg.ratio, NoHeadroom: true, Refresh: -1})
		if err != nil {
			// A typo in AUTOMEMLIMIT must not stop the program.
			fmt.Fprintf(stderr, "memctl: warning: GOMEMLIMIT not set: %v\n", err)
			ml = limits.MemLimit{Reason: err.Error()}
		}
		var note string
		env, note = goMemLimitEnv(env, ml)
		verbose("%s", note)
		if cfg.arenaMax > 0 {
			env, note = arenaMaxEnv(env, cfg.arenaMax)
			verbose("%s", note)
		}
	}
	if n := restoreIgnored(); n != "" {
		verbose("%s", n)
	}
	return execFirst(paths, args, env, stderr, verbose)
}

// restoreIgnored restores the inherited ignored signals and signal mask for
// the program. It locks the goroutine to its thread, which must then exec,
// and returns a sentence for -v.
func restoreIgnored() string {
	runtime.LockOSThread()
	mask, exact := inheritedIgnored()
	blocked, _ := inheritedBlocked()
	for s := 1; s <= 64; s++ {
		if mask&(1<<(s-1)) != 0 {
			signal.Ignore(syscall.Signal(s))
		}
	}
	// After signal.Ignore, which leaves the runtime's own signals to it.
	restoreSignals()
	n := "signals ignored as inherited: " + signalNames(mask)
	if mask == 0 {
		n = "no signal inherited ignored"
	}
	if !exact {
		n += " (built without cgo: only SIGHUP and SIGINT can be seen)"
	}
	if blocked != 0 {
		n += "\nmemctl: signals blocked as inherited: " + signalNames(blocked)
	}
	return n
}

// signalNames names the signals of mask (bit s-1 for signal s).
func signalNames(mask uint64) string {
	var names []string
	for s := 1; s <= 64; s++ {
		if mask&(1<<(s-1)) != 0 {
			name := unix.SignalName(syscall.Signal(s))
			if name == "" {
				name = "signal " + strconv.Itoa(s)
			}
			names = append(names, name)
		}
	}
	return strings.Join(names, " ")
}

// execFirst execs the first of paths that execve(2) runs, as execvp(3)
// (ENOEXEC: with /bin/sh). It returns only when none ran: 127 for ENOENT
// with no EACCES, 126 otherwise, as env(1).
func execFirst(paths, args, env []string, stderr io.Writer, verbose func(string, ...any)) int {
	var last error
	lastPath, denied := "", false
	for _, p := range paths {
		verbose("exec %s", p)
		err := syscall.Exec(p, args, env)
		if err == syscall.ENOEXEC {
			err = syscall.Exec("/bin/sh", append([]string{"/bin/sh", p}, args[1:]...), env)
		}
		if !denied || err != syscall.ENOENT && err != syscall.ENOTDIR {
			last, lastPath = err, p
		}
		if err == syscall.EACCES {
			denied = true
		}
		// The errors execvp(3) moves on after (glibc posix/execvpe.c).
		switch err {
		case syscall.EACCES, syscall.ENOENT, syscall.ENOTDIR, syscall.ESTALE, syscall.ENODEV, syscall.ETIMEDOUT:
			continue
		}
		break
	}
	fmt.Fprintf(stderr, "memctl: exec %s: %v\n", lastPath, last)
	if errors.Is(last, syscall.ENOENT) && !denied {
		return exitNotFound // for example a script whose interpreter is missing
	}
	return exitNoExec
}
