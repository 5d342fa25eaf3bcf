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
)

const execUsage = `usage: memctl exec [flags] [--] PROGRAM [ARGS...]

Apply the memory settings, then replace memctl with PROGRAM (same PID,
signals and exit status). Flags:
`

// execConfig is what the exec flags ask for.
type execConfig struct {
	thp      thp.Policy
	ratio    float64 // 0: limits.DefaultRatio
	arenaMax int
	verbose  bool
}

func runExec(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("exec", flag.ContinueOnError)
	cfg := execConfig{thp: thp.PolicyDisable}
	fs.TextVar(&cfg.thp, "thp", thp.PolicyDisable, "THP `mode` for PROGRAM: disable, except-advised (Linux 6.18+) or keep")
	fs.Float64Var(&cfg.ratio, "ratio", limits.DefaultRatio, "set GOMEMLIMIT to `R` times the cgroup memory limit, R in (0, 1]")
	fs.IntVar(&cfg.arenaMax, "arena-max", 0, "cap glibc malloc arenas at `N` through GLIBC_TUNABLES (0: no cap)")
	fs.BoolVar(&cfg.verbose, "v", false, "print what was set on standard error")
	if done, status := parseFlags(fs, args, execUsage, stdout, stderr); done {
		return status
	}
	ratioSet := false
	fs.Visit(func(f *flag.Flag) { ratioSet = ratioSet || f.Name == "ratio" })
	if fs.NArg() == 0 {
		return usageError(fs, execUsage, stderr, "no PROGRAM to run")
	}
	if math.IsNaN(cfg.ratio) || cfg.ratio <= 0 || cfg.ratio > 1 {
		return usageError(fs, execUsage, stderr, "-ratio %v: want a ratio in (0, 1]", cfg.ratio)
	}
	if cfg.arenaMax < 0 {
		return usageError(fs, execUsage, stderr, "-arena-max %d: want 0 (no cap) or a count of arenas", cfg.arenaMax)
	}
	if !ratioSet {
		cfg.ratio = 0 // limits.DefaultRatio, reported as the default
	}
	return execProgram(cfg, fs.Args(), stderr)
}

// goMemLimitEnv returns env with GOMEMLIMIT set to ml.Bytes when ml's limit
// came from a cgroup (or the system) and env does not set GOMEMLIMIT, and a
// sentence for -v.
func goMemLimitEnv(env []string, ml limits.MemLimit) ([]string, string) {
	if v, ok := lookupEnv(env, "GOMEMLIMIT"); ok {
		return env, "GOMEMLIMIT=" + v + " left as set"
	}
	switch ml.Source {
	case limits.SourceCgroupV1, limits.SourceCgroupV2, limits.SourceSystem:
	default:
		return env, "GOMEMLIMIT not set (" + ml.Reason + ")"
	}
	if ml.Bytes <= 0 || ml.Bytes == math.MaxInt64 {
		return env, "GOMEMLIMIT not set (" + ml.Reason + ")"
	}
	v := strconv.FormatInt(ml.Bytes, 10)
	return setEnv(env, "GOMEMLIMIT", v), fmt.Sprintf("GOMEMLIMIT=%s (%s of %d bytes)", v, ml.Reason, ml.Limit)
}

// arenaTunable is the glibc tunable that caps malloc arenas.
const arenaTunable = "glibc.malloc.arena_max"

// arenaMaxEnv returns env with glibc.malloc.arena_max=n appended to
// GLIBC_TUNABLES (colon-separated name=value pairs, see glibc's "Tunables"
// manual), unless the operator already capped arenas there or with
// MALLOC_ARENA_MAX, and a sentence for -v.
func arenaMaxEnv(env []string, n int) ([]string, string) {
	if v, ok := lookupEnv(env, "MALLOC_ARENA_MAX"); ok {
		return env, "GLIBC_TUNABLES left as it is: MALLOC_ARENA_MAX=" + v + " is set"
	}
	cur, _ := lookupEnv(env, "GLIBC_TUNABLES")
	for _, kv := range strings.Split(cur, ":") {
		if k, _, _ := strings.Cut(kv, "="); k == arenaTunable {
			return env, "GLIBC_TUNABLES=" + cur + " left as it is: it sets " + arenaTunable
		}
	}
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
// harmless: memctl is about to be replaced.
func memLimit(cfg execConfig) (limits.MemLimit, error) {
	return limits.SetGoMemLimit(context.Background(), limits.MemLimitConfig{Ratio: cfg.ratio})
}

// memctlOff reports whether MEMCTL=off asks memctl to change nothing.
func memctlOff() bool { return os.Getenv("MEMCTL") == "off" }
