package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/memctl/memctl/limits"
	"github.com/memctl/memctl/thp"
	"github.com/memctl/memctl/trim/cheap"
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
	ratio    float64 // 0: limits.DefaultRatio
	arenaMax int
	off      bool // MEMCTL=off: change nothing
	verbose  bool
}

func runExec(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("exec", flag.ContinueOnError)
	cfg := execConfig{thp: thp.PolicyDisable}
	fs.TextVar(&cfg.thp, "thp", thp.PolicyDisable, "THP `mode` for PROGRAM: disable, except-advised (Linux 6.18+) or keep; MEMCTL_THP sets the default")
	fs.Float64Var(&cfg.ratio, "ratio", limits.DefaultRatio, "set GOMEMLIMIT to `R` times the cgroup memory limit, R in (0, 1]")
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
		cfg.ratio = 0 // limits.DefaultRatio, reported as the default
	}
	for _, w := range cfg.applyEnv(os.Getenv, func(name string) bool { return given[name] }) {
		fmt.Fprintln(stderr, w)
	}
	return execProgram(cfg, fs.Args(), stderr)
}

// applyEnv reads memctl's switches through getenv, as memctl.Start does:
// MEMCTL=off (any case) sets cfg.off and nothing else is read; MEMCTL_THP
// and MEMCTL_ARENA_MAX set thp and arenaMax when their flag was not given
// (flagGiven reports that). An empty variable is unset. A value that cannot
// be parsed leaves that part off (THP flag kept as inherited, no arena cap)
// and gives a warning: a typo must not stop a container from starting.
// It returns the warnings, each a line starting with "memctl: warning: ".
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
		n, err := parseArenaMax(v)
		if err != nil {
			warn("%v; no arena cap", err)
		}
		cfg.arenaMax = n
	}
	return warns
}

// parseArenaMax parses MEMCTL_ARENA_MAX as memctl.Start does: "off" (any
// case) or "0" for no cap, or a count of arenas.
func parseArenaMax(v string) (int, error) {
	if strings.EqualFold(v, "off") {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("MEMCTL_ARENA_MAX=%q: want \"off\" or a count of arenas such as \"2\"", v)
	}
	return n, nil
}

// goMemLimitEnv returns env with GOMEMLIMIT set to ml.GoMemLimit when ml's limit
// came from a cgroup (or the system) and env does not set GOMEMLIMIT (an
// empty GOMEMLIMIT is unset, as for the Go runtime), and a sentence for -v.
func goMemLimitEnv(env []string, ml limits.MemLimit) ([]string, string) {
	if v, ok := lookupEnv(env, "GOMEMLIMIT"); ok && v != "" {
		return env, "GOMEMLIMIT=" + v + " left as set"
	}
	switch ml.Source {
	case limits.SourceCgroupV1, limits.SourceCgroupV2, limits.SourceSystem:
	default:
		return env, "GOMEMLIMIT not set (" + ml.Reason + ")"
	}
	if ml.GoMemLimit <= 0 || ml.GoMemLimit == math.MaxInt64 {
		return env, "GOMEMLIMIT not set (" + ml.Reason + ")"
	}
	v := strconv.FormatInt(ml.GoMemLimit, 10)
	return setEnv(env, "GOMEMLIMIT", v), fmt.Sprintf("GOMEMLIMIT=%s (%s of %d bytes)", v, ml.Reason, ml.MemoryLimit)
}

// arenaTunable is the glibc tunable that caps malloc arenas.
const arenaTunable = "glibc.malloc.arena_max"

// arenaMaxEnv returns env with glibc.malloc.arena_max=n appended to
// GLIBC_TUNABLES (colon-separated name=value pairs, see glibc's "Tunables"
// manual), unless the operator already capped arenas there or with
// MALLOC_ARENA_MAX, and a sentence for -v. What counts as the operator's cap
// is cheap.OperatorArenaMax's rule, the library's: a MALLOC_ARENA_MAX, or
// a glibc.malloc.arena_max entry in GLIBC_TUNABLES, with a value that glibc
// applies (an empty value or 0 is no cap).
func arenaMaxEnv(env []string, n int) ([]string, string) {
	getenv := func(k string) string { v, _ := lookupEnv(env, k); return v }
	switch name, v, ok := cheap.OperatorArenaMax(getenv); {
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

// lookupEnv returns the value of the first key= entry of env, as getenv(3)
// and os.Getenv do.
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

// prepareEnv applies cfg's GOMEMLIMIT and arena settings to env and returns
// it with the -v sentences. ml is limits.SetGoMemLimit's decision for this
// process, whose cgroup the program will be in.
func prepareEnv(env []string, cfg execConfig, ml limits.MemLimit) ([]string, []string) {
	var notes []string
	env, note := goMemLimitEnv(env, ml)
	notes = append(notes, note)
	if cfg.arenaMax > 0 {
		env, note = arenaMaxEnv(env, cfg.arenaMax)
		notes = append(notes, note)
	}
	return env, notes
}

// memLimit asks package limits for GOMEMLIMIT at cfg.ratio of this
// process's cgroup limit. It also sets memctl's own GOMEMLIMIT, which is
// harmless: memctl is about to be replaced. No headroom (the memory outside
// the Go runtime measured would be memctl's, not the program's) and no
// refresh (the program sets none itself).
func memLimit(cfg execConfig) (limits.MemLimit, error) {
	return limits.SetGoMemLimit(context.Background(), limits.MemLimitConfig{Ratio: cfg.ratio, NoHeadroom: true, Refresh: -1})
}
