package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/memctl/memctl/internal/arenamax"
	"github.com/memctl/memctl/limits"
	"github.com/memctl/memctl/thp"
)

const execUsage = `usage: memctl exec [flags] [--] PROGRAM [ARGS...]

Apply the memory settings, then replace memctl with PROGRAM (same PID,
signals and exit status). Flags:
`

// execConfig is what the exec flags and the environment ask for.
type execConfig struct {
	thp      thp.Policy
	thpFrom  string  // where thp came from, for -v: "-thp=disable", "MEMCTL_THP=keep"
	thpEnv   bool    // thp came from MEMCTL_THP: failing to apply it is a warning
	ratio    float64 // 0: the library's default ratio
	arenaMax int
	off      bool // MEMCTL=off: change nothing
	verbose  bool
}

func runExec(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("exec", flag.ContinueOnError)
	cfg := execConfig{thp: thp.PolicyDisable}
	fs.TextVar(&cfg.thp, "thp", thp.PolicyDisable, "THP `mode` for PROGRAM: disable, except-advised (Linux 6.18+) or keep; MEMCTL_THP sets the default")
	fs.Float64Var(&cfg.ratio, "ratio", 0.9, // the library's default
		"set GOMEMLIMIT to `R` times the cgroup memory limit, R in (0, 1]")
	fs.IntVar(&cfg.arenaMax, "arena-max", 0, "cap glibc malloc arenas at `N` through GLIBC_TUNABLES (0: no cap); MEMCTL_ARENA_MAX sets the default")
	fs.BoolVar(&cfg.verbose, "v", false, "print what was set on standard error")
	if done, status := parseFlags(fs, args, execUsage, stdout, stderr); done {
		return status
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if fs.NArg() == 0 {
		return usageError(fs, execUsage, stderr, "no PROGRAM to run")
	}
	if math.IsNaN(cfg.ratio) || cfg.ratio <= 0 || cfg.ratio > 1 {
		return usageError(fs, execUsage, stderr, "-ratio %v: want a ratio in (0, 1]", cfg.ratio)
	}
	if cfg.arenaMax < 0 {
		return usageError(fs, execUsage, stderr, "-arena-max %d: want 0 (no cap) or a count of arenas", cfg.arenaMax)
	}
	if !given["ratio"] {
		cfg.ratio = 0 // the default, reported as such
	}
	for _, w := range cfg.applyEnv(os.Getenv, func(name string) bool { return given[name] }) {
		fmt.Fprintln(stderr, w)
	}
	return execProgram(cfg, fs.Args(), stderr)
}

// applyEnv reads MEMCTL, and MEMCTL_THP and MEMCTL_ARENA_MAX unless their
// flag was given; an invalid value leaves that part off and returns a warning.
func (cfg *execConfig) applyEnv(getenv func(string) string, flagGiven func(string) bool) []string {
	var warns []string
	warn := func(format string, a ...any) {
		warns = append(warns, "memctl: warning: "+fmt.Sprintf(format, a...))
	}
	if cfg.thpFrom == "" {
		cfg.thpFrom = "-thp=" + cfg.thp.String()
	}
	switch v := getenv("MEMCTL"); {
	case strings.EqualFold(strings.TrimSpace(v), "off"):
		cfg.off = true
		return nil
	case v != "":
		warn("MEMCTL=%q is not \"off\": memctl applies its settings", v)
	}
	if v := getenv("MEMCTL_THP"); v != "" && !flagGiven("thp") {
		p, err := thp.ParsePolicy(v)
		if err != nil {
			warn("MEMCTL_THP=%q: %v; THP flag left as inherited", v, err)
			cfg.thp, cfg.thpFrom = thp.PolicyKeep, "MEMCTL_THP invalid: left as inherited"
		} else {
			cfg.thp, cfg.thpFrom, cfg.thpEnv = p, "MEMCTL_THP="+v, true
		}
	}
	if v := getenv("MEMCTL_ARENA_MAX"); v != "" && !flagGiven("arena-max") {
		n, err := strconv.Atoi(v)
		switch {
		case strings.EqualFold(v, "off"):
			n = 0
		case err != nil || n < 0:
			warn("MEMCTL_ARENA_MAX=%q: want \"off\" or a count of arenas such as \"2\"; no arena cap", v)
			n = 0
		}
		cfg.arenaMax = n
	}
	return warns
}

// goMemLimitEnv returns env with GOMEMLIMIT set from ml, from a cgroup or the
// system, unless env sets one, and a sentence for -v.
func goMemLimitEnv(env []string, ml limits.MemLimit) ([]string, string) {
	if v, ok := lookupEnv(env, "GOMEMLIMIT"); ok && v != "" {
		return env, "GOMEMLIMIT=" + v + " left as set"
	}
	switch ml.Source {
	case limits.SourceCgroupV1, limits.SourceCgroupV2, limits.SourceSystem:
		if ml.GoMemLimit > 0 && ml.GoMemLimit != math.MaxInt64 {
			v := strconv.FormatInt(ml.GoMemLimit, 10)
			return setEnv(env, "GOMEMLIMIT", v), fmt.Sprintf("GOMEMLIMIT=%s (%s of %d bytes)", v, ml.Reason, ml.MemoryLimit)
		}
	}
	return env, "GOMEMLIMIT not set (" + ml.Reason + ")"
}

const arenaTunable = "glibc.malloc.arena_max"

// arenaMaxEnv returns env with glibc.malloc.arena_max=n appended to
// GLIBC_TUNABLES unless the operator caps arenas, and a sentence for -v.
func arenaMaxEnv(env []string, n int) ([]string, string) {
	getenv := func(k string) string { v, _ := lookupEnv(env, k); return v }
	switch name, v, ok := arenamax.Operator(getenv); {
	case ok && name == "MALLOC_ARENA_MAX":
		return env, "GLIBC_TUNABLES left as it is: MALLOC_ARENA_MAX=" + v + " is set"
	case ok:
		return env, "GLIBC_TUNABLES=" + v + " left as it is: it sets " + arenaTunable
	}
	cur, _ := lookupEnv(env, "GLIBC_TUNABLES")
	v := arenaTunable + "=" + strconv.Itoa(n)
	if cur != "" {
		v = cur + ":" + v
	}
	return setEnv(env, "GLIBC_TUNABLES", v), "GLIBC_TUNABLES=" + v
}

// lookupEnv returns the value of the first key= entry of env, as getenv(3).
func lookupEnv(env []string, key string) (string, bool) {
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v, true
		}
	}
	return "", false
}

// setEnv returns env with key set to value: the first key= entry replaced,
// later ones dropped, or a new entry appended. env is not modified.
func setEnv(env []string, key, value string) []string {
	out := make([]string, 0, len(env)+1)
	set := false
	for _, kv := range env {
		if k, _, ok := strings.Cut(kv, "="); ok && k == key {
			if !set {
				out = append(out, key+"="+value)
				set = true
			}
			continue
		}
		out = append(out, kv)
	}
	if !set {
		out = append(out, key+"="+value)
	}
	return out
}

var (
	errNotFound    = errors.New("executable file not found in $PATH")
	errNameTooLong = errors.New("file name too long") // over NAME_MAX, as execvp(3)
)

// lookPath returns the files exec tries for file, in order, as execvp(3),
// leaving out what does not exist or is a directory. The error is
// errNotFound, errNameTooLong, or fs.ErrPermission when only directories
// match.
func lookPath(file, path string, pathSet bool, stat func(string) (fs.FileInfo, error)) ([]string, error) {
	switch {
	case strings.Contains(file, "/"):
		return []string{file}, nil
	case file == "":
		return nil, errNotFound
	case len(file) > 255:
		return nil, errNameTooLong
	case !pathSet:
		path = "/bin:/usr/bin"
	}
	var found []string
	dir := false
	for _, d := range strings.Split(path, ":") {
		p := cmp.Or(d, ".") + "/" + file
		fi, err := stat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR):
		case err == nil && fi.IsDir():
			dir = true
		default:
			found = append(found, p) // execve(2) says why, if err != nil
		}
	}
	switch {
	case len(found) > 0:
		return found, nil
	case dir:
		return nil, fs.ErrPermission
	}
	return nil, errNotFound
}
