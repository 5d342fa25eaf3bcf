// Memctl shows the memory settings of a process, and runs any program with
// transparent huge pages off, GOMEMLIMIT set from the cgroup limit and,
// optionally, a glibc arena cap. It is the operator's side of the memctl
// library, for programs that cannot be rebuilt.
//
// Install:
//
//	go install github.com/memctl/memctl/memctl@latest
//
// Usage:
//
//	memctl status [-pid PID] [-json]
//	memctl exec [-thp disable|except-advised|keep] [-ratio R] [-arena-max N] [-v] [--] PROGRAM [ARGS...]
//
// # status
//
// status prints, for the process PID (default: memctl itself), the
// answers to the first questions about a process whose RSS looks wrong:
//
//   - the system THP settings: the mode (enabled, and the per-size mode of
//     PMD-sized pages where the kernel has one), defrag and
//     khugepaged/max_ptes_none, from /sys/kernel/mm/transparent_hugepage;
//   - the process's THP flag, THP_enabled in /proc/PID/status (0 when the
//     process called prctl(PR_SET_THP_DISABLE) or inherited it), and the
//     bytes in huge pages, AnonHugePages in /proc/PID/smaps_rollup. The
//     kernel writes 1 both for a clear flag and for "disabled except
//     advised" (Linux 6.18), so the table says /proc cannot tell them
//     apart; for memctl itself (no -pid, or its own) it reads the flag with
//     prctl(PR_GET_THP_DISABLE) and says which;
//   - VmRSS and VmHWM (peak RSS) from /proc/PID/status;
//   - the memory limit of the process's cgroup, v1 (memory.limit_in_bytes)
//     or v2 (memory.max), the tightest of the cgroup and its ancestors, and
//     the file it came from; "none" when no limit is set;
//   - the memory settings in the environment the process started with
//     (/proc/PID/environ): GOMEMLIMIT, GOGC, GODEBUG, AUTOMEMLIMIT, MEMCTL*,
//     MALLOC_* (MALLOC_ARENA_MAX, jemalloc's MALLOC_CONF), MIMALLOC_* and
//     GLIBC_TUNABLES.
//
// Reading another user's process needs root. A PID that does not exist or
// cannot be read is an error naming it (exit status 1).
//
// With -json, status prints one JSON object instead of the table. Its keys
// are stable (new keys may be added; none is renamed or removed), sizes are
// integers in bytes, and a value that is not available is null:
//
//	{
//	  "pid": 1234,                        // the process
//	  "thp_system": {                     // null on a kernel without THP
//	    "enabled": "always",              // .../transparent_hugepage/enabled
//	    "pmd_enabled": "inherit",         // hugepages-2048kB/enabled, "" before Linux 6.8
//	    "defrag": "madvise",              // .../defrag
//	    "pmd_size_bytes": 2097152,        // hpage_pmd_size
//	    "max_ptes_none": 511              // khugepaged/max_ptes_none, -1 when absent
//	  },
//	  "thp_enabled": 0,                   // THP_enabled in /proc/PID/status, null before Linux 5.0
//	  "anon_huge_pages_bytes": 0,         // AnonHugePages in /proc/PID/smaps_rollup
//	  "vm_rss_bytes": 7745536,            // VmRSS in /proc/PID/status
//	  "vm_hwm_bytes": 7745536,            // VmHWM in /proc/PID/status
//	  "cgroup": {                         // null when no memory cgroup is found
//	    "version": 2,                     // 1 or 2
//	    "path": "/system.slice/app.service",      // as in /proc/PID/cgroup
//	    "dir": "/sys/fs/cgroup/system.slice/app.service",
//	    "limit_bytes": 1073741824,        // null: no limit
//	    "limit_file": "/sys/fs/cgroup/system.slice/memory.max"  // null: no limit
//	  },
//	  "cgroup_error": "...",              // only when "cgroup" is null: why
//	  "env": {"GOGC": "50", "GOMEMLIMIT": "241591910"}, // the variables that are set
//	  "env_base64": ["TUFMTE9DX1g9/w=="]  // only when a variable is not valid UTF-8, see below
//	}
//
// "env" holds each variable as it is, name and value, when both are valid
// UTF-8. A variable whose name or value is not valid UTF-8 cannot be a
// JSON string without changing it, so it is not in "env": its whole
// NAME=value entry from /proc/PID/environ is in "env_base64", in standard
// base64 (RFC 4648, with padding), and the list is sorted. The example
// above is MALLOC_X set to the byte 0xff. The table shows such a name or
// value, and one that holds a character that is not printable (a control
// character such as ESC or U+009B, which a terminal takes as the start of
// an escape sequence), quoted as a Go string literal (strconv.Quote):
// MALLOC_X="\xff". The cgroup path and file are shown the same way.
//
// # exec
//
// exec applies the settings to itself and then replaces itself with PROGRAM
// (execve(2)), so the process ID, the signals and the exit status are the
// program's own. PROGRAM is looked up in PATH unless it contains a slash.
//
//   - -thp (default disable, or MEMCTL_THP): the THP flag,
//     prctl(PR_SET_THP_DISABLE). The flag is inherited by children and kept
//     across execve, so the program and everything it starts run without
//     new huge pages; except-advised (Linux 6.18 and later) keeps them in
//     regions the program advises with madvise(MADV_HUGEPAGE); keep leaves
//     the flag as inherited.
//   - -ratio (default 0.9): GOMEMLIMIT is set to this share of the cgroup
//     memory limit memctl and the program are in (package limits, through
//     automemlimit). It is not set when there is no limit, when GOMEMLIMIT
//     is already set (an empty GOMEMLIMIT is unset, as for the Go runtime),
//     or when AUTOMEMLIMIT=off; a ratio in AUTOMEMLIMIT wins over -ratio.
//     The variable does nothing for programs not written in Go.
//   - -arena-max N (default 0, off, or MEMCTL_ARENA_MAX): caps glibc malloc
//     arenas by appending glibc.malloc.arena_max=N to GLIBC_TUNABLES, after
//     what is there. Not done when GLIBC_TUNABLES already sets arena_max or
//     MALLOC_ARENA_MAX is set, to a value glibc applies (not empty, not 0):
//     the same rule as the library's (cheap.OperatorArenaMax).
//   - -v prints what was set on standard error; otherwise exec prints
//     nothing but warnings.
//
// The environment holds the same switches as for the library (memctl.Start):
//
//   - MEMCTL=off (any case): exec changes nothing and runs the program as
//     it is. Any other non-empty value is a warning, and exec goes on.
//   - MEMCTL_THP=disable|except-advised|keep is the default of -thp, and
//     MEMCTL_ARENA_MAX=N|off the default of -arena-max; a flag given on the
//     command line wins. An empty variable is unset.
//
// A setting that comes from the environment never stops the program: a
// value that cannot be parsed (MEMCTL_THP, MEMCTL_ARENA_MAX, AUTOMEMLIMIT),
// a MEMCTL_THP policy the kernel refuses, or a cgroup file that cannot be
// read, prints "memctl: warning: ..." on standard error, leaves that part
// off (THP flag as inherited, no arena cap, no GOMEMLIMIT) and runs the
// program. A bad flag is a usage error, and a -thp the kernel refuses is an
// error: the program is not run. exec is Linux only; elsewhere it fails
// with an error (errors.ErrUnsupported).
//
// # Exit status
//
// 0 on success (for exec: the program's own status), 1 on an error (memctl
// prints "memctl: ..." on standard error), 2 on a usage error; -h prints the
// usage and exits 0. As env(1) and nohup(1) do, exec exits 127 when PROGRAM
// is not found and 126 when it is found but cannot be executed.
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
  memctl status [-pid PID] [-json]
  memctl exec [-thp disable|except-advised|keep] [-ratio R] [-arena-max N] [-v] [--] PROGRAM [ARGS...]

status shows the THP settings, RSS, cgroup memory limit and memory
environment of a process. exec runs PROGRAM with THP disabled, GOMEMLIMIT
set from the cgroup limit, and optionally a glibc arena cap.
Run "memctl status -h" or "memctl exec -h" for the flags.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run runs memctl with args (without the program name) and returns the exit
// status. exec does not return when it succeeds.
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

// parseFlags parses args with fs. It returns done and the exit status when
// memctl should stop: after -h (usage on stdout, 0) or a bad flag (the error
// and usage on stderr, 2).
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
	fmt.Fprintf(stderr, "memctl %s: %v\n", fs.Name(), err)
	printUsage(fs, usage, stderr)
	return true, exitUsage
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
