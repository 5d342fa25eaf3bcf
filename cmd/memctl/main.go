// Memctl shows the memory settings of a process, and runs any program with
// transparent huge pages off, GOMEMLIMIT set from the cgroup limit and,
// optionally, a glibc arena cap. It is the operator's side of the memctl
// library, for programs that cannot be rebuilt.
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
//   - VmRSS, VmHWM (peak RSS), RssAnon, RssFile, RssShmem and VmSwap (the
//     process's anonymous memory in swap) from /proc/PID/status, which the
//     kernel writes from counters without locking the process's mappings;
//   - Pss and AnonHugePages from /proc/PID/smaps_rollup, only when VmRSS is
//     under 256 MiB or with -smaps. The kernel fills smaps_rollup by walking
//     the page tables of every mapping while holding the process's mmap
//     lock, and the process's own mmap and munmap wait for it: measured on
//     a 2-core machine (kernel 6.18), the worst mmap+munmap of a target
//     reading 20 times was 0.3-1.7 s with 16 GiB touched, 50-145 ms with
//     4 GiB and 4 ms with 256 MiB, while reading /proc/PID/status stalled
//     nothing. An operator's look must not hurt
//     the service, so above 256 MiB the table says "not read" and why
//     ("smaps_rollup" in the JSON), and -smaps reads it anyway;
//   - the swap of the process's cgroup: v2 memory.swap.current and the
//     cgroup's own memory.swap.max (memory.max does not count swap: with
//     Kubernetes NodeSwap a heap pushed to swap shows here and in VmSwap,
//     not in RSS, and GOMEMLIMIT is still taken from memory.max), v1
//     memory.memsw.usage_in_bytes and memory.memsw.limit_in_bytes (memory
//     plus swap together); "no ... the kernel does not account swap for this
//     cgroup" when the files are absent;
//   - the memory limit of the process's cgroup, v1 (memory.limit_in_bytes)
//     or v2 (memory.max), the tightest of the cgroup and its ancestors, and
//     the file it came from; "none" when no limit is set. The files are
//     read as the process's mount namespace shows them. When that
//     namespace has cgroup v2 without the memory controller and no v1
//     memory mount (a container on a hybrid host), the v1 memory cgroup
//     that /proc/PID/cgroup lists is read in memctl's own mount namespace
//     instead, and the table says so; so is the cgroup of a process in
//     another mount namespace that shows no mount of its hierarchy at all
//     (a container without /sys/fs/cgroup). A process chrooted in memctl's own
//     mount namespace, whose root shows no cgroup mount (its mountinfo is
//     empty), has its cgroup from /proc/PID/cgroup read from memctl's own
//     root: the same mounts, and nothing the process arranged in its root
//     is trusted;
//   - the memory settings in the environment the process started with
//     (/proc/PID/environ): GOMEMLIMIT, GOGC, GODEBUG, AUTOMEMLIMIT, MEMCTL*,
//     MALLOC_* (MALLOC_ARENA_MAX, jemalloc's MALLOC_CONF), MIMALLOC_* and
//     GLIBC_TUNABLES;
//   - what the memctl library inside the process decided, when the process
//     uses it: its state record (package internal/state), which memctl.Start
//     publishes in a sealed memfd named "memctl-state" and replaces whole
//     when a decision changes (GOMEMLIMIT in force, its source and reason,
//     whether the limit is unknown, the THP policy, the trims run and
//     skipped by origin and reason, the bursts detected at GC end, the
//     budget pools with their refusals, charge check and request peaks,
//     the pressure source and what it did, each C allocator found). The
//     record is what the process says of itself, not
//     a fact memctl checked (its swap figures are as of the record's
//     update, not now): the table shows it under "memctl" as
//     "reported by the process (not checked)", every string in it quoted.
//     A record that is not one JSON object of the known types and version,
//     that is larger than 64 KiB, that lists more than 64 pools or 16 C
//     heaps, that holds a negative size or count, or whose peak histogram
//     disagrees with its own quantiles, is rejected whole (never shown in
//     part): "memctl" is unknown with the
//     reason (exit status 3). A process without a record is not an error
//     ("memctl": null, exit status 0).
//
// Reading another user's process needs root. A PID that does not exist, or
// whose /proc/PID/status cannot be read, is an error naming it (exit status
// 1), and so is a process that exits while memctl reads it: one error,
// "process N exited while memctl read it" (memctl holds /proc/PID open and
// compares the start time in /proc/PID/stat before and after, so a reused
// PID is caught too).
//
// Each other field is read on its own: one that cannot be read (a
// permission, a file the process replaced, see Security) is shown as
// "unknown: " and the reason, the rest is printed, and the exit status is 3.
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
//	  "anon_huge_pages_bytes": 0,         // AnonHugePages in /proc/PID/smaps_rollup, null when not read
//	  "vm_rss_bytes": 7745536,            // VmRSS in /proc/PID/status
//	  "vm_hwm_bytes": 7745536,            // VmHWM in /proc/PID/status
//	  "cgroup": {                         // null when no memory cgroup is found
//	    "version": 2,                     // 1 or 2
//	    "path": "/system.slice/app.service",      // as in /proc/PID/cgroup
//	    "dir": "/sys/fs/cgroup/system.slice/app.service",
//	    "limit_bytes": 1073741824,        // null: no limit
//	    "limit_file": "/sys/fs/cgroup/system.slice/memory.max", // null: no limit
//	    "view": "process",                // "memctl": read in memctl's mount namespace (the process's mounts no hierarchy with its memory controller); "memctl-root": from memctl's root (chrooted process)
//	    "swap": {                         // null when the files are absent; then "swap_note" says so
//	      "current_bytes": 314572800,     // memory.swap.current (v1: memory.memsw.usage_in_bytes)
//	      "max_bytes": null,              // memory.swap.max of the cgroup itself, null: "max" (v1: memsw.limit_in_bytes)
//	      "current_file": "/sys/fs/cgroup/system.slice/app.service/memory.swap.current",
//	      "max_file": "/sys/fs/cgroup/system.slice/app.service/memory.swap.max",
//	      "memory_plus_swap": false}      // true in v1: memsw counts memory and swap together
//	  },
//	  "cgroup_error": "...",              // only when "cgroup" is null: why
//	  "env": {"GOGC": "50", "GOMEMLIMIT": "241591910"}, // the variables that are set; null when unknown
//	  "rss_anon_bytes": 1052672,          // RssAnon, RssFile, RssShmem, VmSwap in /proc/PID/status
//	  "rss_file_bytes": 6692864, "rss_shmem_bytes": 0, "vm_swap_bytes": 0,
//	  "pss_bytes": 5615616,               // Pss in /proc/PID/smaps_rollup, null when not read
//	  "smaps_rollup": {"read": true,      // whether smaps_rollup was read, and why
//	    "why": "read: VmRSS 7.4 MiB is under 256.0 MiB"},
//	  "env_base64": ["TUFMTE9DX1g9/w=="], // only when a variable is not valid UTF-8, see below
//	  "memory_events": {"oom_kill": 0},   // cgroup v2 memory.events counters, when read
//	  "memctl": {                         // the library's state record; null when none
//	    "reported_by": "process",         // always: the values are the process's own word
//	    "file": "/proc/1234/fd/5",        // where it was read
//	    "version": 1, "pid": 1, "seq": 3, "updated": "2026-12-01T10:00:00Z",
//	    "off": false, "closed": false,
//	    "gomemlimit": {"bytes": 237670254, "source": "cgroup v1", "file": "...",
//	      "memory_limit_bytes": 268435456, "ratio": 0.9, "outside_bytes": 3921656,
//	      "refresh_seconds": 10, "reason": "...",  // bytes: null for no limit
//	      "limit_unknown": false},        // true: none up to a cgroup namespace top that is not the root
//	    "thp": {"policy": "except-advised", "state": "disabled-except-advised", "system": "madvise"},
//	    "trim": {"delay_seconds": 2, "trims": 1, "skipped": 0, "go_skipped": 0,
//	      "c_skipped": 1, "released_bytes": 34119680, "last_released_bytes": 34119680,
//	      "cpu_seconds": 0.0026, "deferred": 0, "early_starts": 0,
//	      "origins": {                    // who asked: debounced, pressure, spiral, by_name (TrimNow)
//	        "debounced": {"trims": 1, "skipped": 0, "cpu_seconds": 0.0026, "released_bytes": 34119680},
//	        "pressure": {...}, "spiral": {...}, "by_name": {...}},
//	      "skipped_by": {"min_release": 0, "cost": 0, "budget": 0, "running": 0}},
//	    "pools": [{"name": "api", "mode": "enforce", "limit_bytes": 118798263,
//	      "used_bytes": 0, "peak_bytes": 3145728, "in_flight": 0,
//	      "refused": 1, "observed": 0, "canceled": 0, "undercharged": 0,
//	      "peaks": {"count": 3, "p50_bytes": 2097152, "p99_bytes": 4194304,
//	        "max_bytes": 4194304,        // bucket bounds: 64 KiB << i; 9223372036854775807 above 64 GiB
//	        "counts": [0, 0, 0, 0, 1, 1, 1, 0, ...]}}],  // 22 buckets, absent when count is 0
//	    "pools_omitted": 0,               // only when more pools than the record lists (64)
//	    "pressure": {"source": "cgroup v1 .../memory.pressure_level low",
//	      "signals": 0, "acted": 0, "left_to_kernel": 0, "cancels_held": 0,
//	      "spirals": 0, "lifts": 0, "lifted_bytes": 0},
//	    "c_heap": "glibc",
//	    "c_heaps": [{"allocator": "glibc", "library": "/lib/x86_64-linux-gnu/libc.so.6",
//	      "owns_malloc": true, "trimmed": true, "note": "...", "releases": 0,
//	      "skipped": 0, "released_bytes": 0, "retained_bytes": 656112}],  // retained -1: unknown; at most 16
//	    "auto_burst": {"bursts": 0, "drops": 0, "marks": 0, "settled": 0,
//	      "floor_bytes": 258000, "gc_ends": 4},
//	    "swap": {"vm_swap_bytes": 0, "cgroup_version": 2, "current_bytes": 0,
//	      "max_bytes": null, "file": "..."}  // as of "updated"; newer libraries add keys; this memctl shows those it knows
//	  },
//	  "unknown": {                        // only when a field could not be read:
//	    "anon_huge_pages_bytes": "procfs: open \"/proc/1/smaps_rollup\": permission denied"
//	  }                                   // its key and the reason (exit status 3)
//	}
//
// The keys of "unknown" are those of the fields above: thp_system,
// thp_enabled, anon_huge_pages_bytes, pss_bytes, vm_rss_bytes, vm_hwm_bytes,
// rss_anon_bytes, rss_file_bytes, rss_shmem_bytes, vm_swap_bytes, env,
// cgroup, swap, memory_events, memctl. smaps_rollup not read by the rule
// above is not unknown (exit status 0). The JSON text escapes every character that is not
// printable (\u escapes, strconv.IsPrint), so a C1 control such as U+009B
// never reaches a terminal raw; the values are unchanged.
//
// "env" holds each variable as it is, name and value, when both are valid
// UTF-8. A variable whose name or value is not valid UTF-8 cannot be a
// JSON string without changing it, so it is not in "env": its whole
// NAME=value entry from /proc/PID/environ is in "env_base64", in standard
// base64 (RFC 4648, with padding), and the list is sorted. The example
// above is MALLOC_X set to the byte 0xff. The table shows every string the
// process supplied (each NAME=value, the cgroup path and file, names in
// errors) as a Go string literal (strconv.Quote, through one function,
// safefs.Quote), cut to its first 200 bytes: "MALLOC_X=\xff"; a control
// character such as ESC or U+009B, which a terminal takes as the start of
// an escape sequence, is escaped.
//
// # Security
//
// status is meant to be run as root on processes it does not trust (a
// tenant's container), which control their own mount namespace and
// environment. It reads, as the user running memctl:
//
//   - /proc/PID/stat, status, smaps_rollup, environ, cgroup and mountinfo,
//     through a directory descriptor of /proc/PID opened once: a name is
//     resolved beneath it with openat2(2) RESOLVE_BENEATH, through no
//     symlink or /proc magic link, and once the process exits every read
//     fails, even if its PID is reused;
//   - the cgroup files (memory.limit_in_bytes, memory.stat, memory.max,
//     cgroup.controllers, memory.events, memory.swap.current,
//     memory.swap.max, memory.memsw.usage_in_bytes,
//     memory.memsw.limit_in_bytes) under the mount points of /proc/PID/mountinfo,
//     inside the process's root (/proc/PID/root) with RESOLVE_IN_ROOT,
//     through no symlink at all (a cgroup file is never one), and only
//     from a cgroup or cgroup2 file system (fstatfs(2)): a file the
//     process bind-mounted over its own cgroup file is refused;
//   - the system THP settings in memctl's own /sys;
//   - the state record: the entries of /proc/PID/fd are listed (at most
//     65536) and their links read; the first that reads "/memfd:memctl-state
//     (deleted)" is opened through the link with O_PATH (no driver's open
//     runs), and read only when it is a regular file of tmpfs or hugetlbfs
//     (a memfd's file systems) of at most 64 KiB, checked before a byte is
//     read (a process that swaps the descriptor for a FIFO, a device or a
//     file of a terabyte is refused), and sealed against writes, growth
//     and shrinking as the library seals it (F_SEAL_WRITE, F_SEAL_GROW,
//     F_SEAL_SHRINK: the content cannot change while it is read; a plain
//     tmpfs file whose link reads the same is refused). Reading
//     /proc/PID/fd needs what reading /proc/PID/environ needs.
//
// It refuses a file that is not a regular file (a FIFO, a device such as
// /dev/zero, a socket; the open uses O_NONBLOCK, so a FIFO cannot block it),
// a symlink, a file larger than a cap (64 KiB for a cgroup file or a /proc
// file, 32 MiB for mountinfo, read as a stream, 6 MiB for environ; see
// safefs.MaxMountinfo and safefs.MaxEnviron), and a read that takes
// longer than 5 s (a FUSE file the process serves); the field is then
// unknown with the reason (exit status 3). An error quotes at most 200 bytes
// of a file or name, escaped. On a kernel without openat2 (before Linux
// 5.6) names are walked one component at a time with O_NOFOLLOW, which
// refuses every symlink. See package internal/safefs.
//
// # exec
//
// exec applies the settings to itself and then replaces itself with PROGRAM
// (execve(2)), so the process ID, the signals and the exit status are the
// program's own.
//
// PROGRAM is found as env(1) finds it (execvp(3)): a name with a slash is
// run as it is; otherwise each directory of PATH is tried in order, an
// empty entry or "." meaning the current directory (which os/exec.LookPath
// refuses), the entry joined with the name as it is (not cleaned: "/a/../b"
// goes through /a as the kernel resolves it), the next one after EACCES,
// ENOENT, ENOTDIR, ESTALE, ENODEV or ETIMEDOUT, and a file the kernel
// refuses as not executable (ENOEXEC, a script without "#!") is run with
// /bin/sh. An empty name is not found (127), a name over NAME_MAX (255
// bytes) is too long (126). An unset PATH is "/bin:/usr/bin", glibc's
// default. One difference: a name that matches only directories is an
// error up front (126, permission denied), as execvp's EACCES.
//
// The signals ignored when memctl started (SIG_IGN, such as SIGPIPE under
// systemd or trap "" PIPE in a shell) are ignored again, and the signal
// mask memctl started with is set again, right before the execve, as
// env(1) leaves them, so the program gets EPIPE rather than death on a
// closed pipe; also with MEMCTL=off. The Go runtime replaces an inherited
// SIG_IGN with its own handler for every signal but SIGHUP and SIGINT, and
// unblocks the signals it needs, before any Go code runs, so memctl reads
// the dispositions and the mask in a C constructor and sets them back with
// sigaction(2) and pthread_sigmask(3): a memctl built without cgo
// (CGO_ENABLED=0) can keep only SIGHUP and SIGINT ignored and not the mask,
// and -v says so.
//
//   - -thp (default disable, or MEMCTL_THP): the THP flag,
//     prctl(PR_SET_THP_DISABLE). The flag is inherited by children and kept
//     across execve, so the program and everything it starts run without
//     new huge pages; except-advised (Linux 6.18 and later) keeps them in
//     regions the program advises with madvise(MADV_HUGEPAGE); keep leaves
//     the flag as inherited.
//   - -ratio (default 0.9): GOMEMLIMIT is set to this share of the cgroup
//     memory limit memctl and the program are in (package limits: the
//     smallest of memory.max and memory.high on v2, limit_in_bytes on v1).
//     It is not set when there is no limit, when GOMEMLIMIT
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
// prints "memctl: ..." on standard error; for status: the process does not
// exist, exited while being read, or its /proc/PID/status cannot be read),
// 2 on a usage error, 3 when status printed its report with some fields
// unknown (each with the reason); -h prints the usage and exits 0. As env(1) and nohup(1) do, exec exits 127 when PROGRAM
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
