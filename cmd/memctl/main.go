// Memctl shows the memory settings of a process, and runs any program with
// transparent huge pages off, GOMEMLIMIT set from the cgroup limit and,
// optionally, a glibc arena cap: the operator's side of the memctl library.
//
// Install:
//
//	go install github.com/memctl/memctl/cmd/memctl@latest
//
// Usage:
//
//	memctl status [-pid PID] [-json] [-smaps]
//	memctl exec [-thp disable|except-advised|keep] [-ratio R] [-arena-max N] [-v] [--] PROGRAM [ARGS...]
//
// status prints the THP settings, memory, cgroup limit and swap, memory
// environment and memctl state record of the process PID (default: memctl
// itself); -json prints one JSON object with stable keys. It may be run as
// root on processes it does not trust.
//
// exec applies the settings, then execs PROGRAM as env(1) does. MEMCTL=off
// changes nothing; MEMCTL_THP and MEMCTL_ARENA_MAX are the defaults of -thp
// and -arena-max.
//
// Exit status: 0 on success (exec: the program's own), 1 on an error, 2 on
// a usage error, 3 when status shows some fields unknown; exec exits 127 or
// 126 as env(1). Fields and schema: docs/command.md and docs/security.md.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

// Exit statuses.
const (
	exitOK       = 0
	exitError    = 1
	exitUsage    = 2
	exitPartial  = 3   // status: some fields could not be read
	exitNoExec   = 126 // found but cannot be executed, as env(1)
	exitNotFound = 127 // not found, as env(1)
)

const usageText = `usage:
  memctl status [-pid PID] [-json] [-smaps]
  memctl exec [-thp disable|except-advised|keep] [-ratio R] [-arena-max N] [-v] [--] PROGRAM [ARGS...]

status shows the THP settings, RSS, cgroup memory limit and memory
environment of a process, and what the memctl library inside it reported
deciding. exec runs PROGRAM with THP disabled, GOMEMLIMIT
set from the cgroup limit, and optionally a glibc arena cap.
Run "memctl status -h" or "memctl exec -h" for the flags.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run runs memctl with args and returns the exit status (exec does not return).
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usageText)
		return exitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usageText)
		return exitOK
	case "status":
		return runStatus(args[1:], stdout, stderr)
	case "exec":
		return runExec(args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "memctl: unknown command %q\n%s", args[0], usageText)
	return exitUsage
}

// parseFlags parses args with fs; done is true after -h or a bad flag.
func parseFlags(fs *flag.FlagSet, args []string, usage string, stdout, stderr io.Writer) (done bool, status int) {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	if err == nil {
		return false, exitOK
	}
	if errors.Is(err, flag.ErrHelp) {
		printUsage(fs, usage, stdout)
		return true, exitOK
	}
	return true, usageError(fs, usage, stderr, "%v", err)
}

func printUsage(fs *flag.FlagSet, usage string, w io.Writer) {
	fmt.Fprint(w, usage)
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

// usageError prints a usage error for the subcommand and returns exitUsage.
func usageError(fs *flag.FlagSet, usage string, stderr io.Writer, format string, args ...any) int {
	fmt.Fprintf(stderr, "memctl %s: %s\n", fs.Name(), fmt.Sprintf(format, args...))
	printUsage(fs, usage, stderr)
	return exitUsage
}
