package limits

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/memctl/memctl/internal/envflag"
	"github.com/memctl/memctl/internal/logattr"
)

// The variables that declare a memory limit where no cgroup shows one
// (docs/environment.md); a bad value is logged at WARN and ignored.
const (
	declaredLimitEnv = "MEMCTL_MEMORY_LIMIT"
	lambdaMemoryEnv  = "AWS_LAMBDA_FUNCTION_MEMORY_SIZE"
)

// maxDeclared is the largest declared limit, in bytes.
const maxDeclared = 1 << 62

// declared is a memory limit the environment declares.
type declared struct {
	bytes  int64
	name   string // the variable, e.g. "MEMCTL_MEMORY_LIMIT"
	value  string // as set
	source Source
}

// file is what MemLimit.File says for it: "MEMCTL_MEMORY_LIMIT=512MiB".
func (d declared) file() string { return d.name + "=" + d.value }

// readDeclared returns the environment's declared limit and the errors of
// bad values; a limit not over rss (held memory, 0 when unknown) is bad.
func readDeclared(rss int64) (d declared, ok bool, bad []error) {
	if v, set := envflag.Lookup(declaredLimitEnv); set {
		n, err := parseSize(v)
		if err == nil && n <= rss {
			err = underRSS(n, rss, strings.Trim(v, "0123456789") == "")
		}
		if err == nil {
			return declared{n, declaredLimitEnv, v, SourceDeclared}, true, nil
		}
		bad = append(bad, fmt.Errorf("limits: %s=%q ignored: %w", declaredLimitEnv, v, err))
	}
	if v, set := envflag.Lookup(lambdaMemoryEnv); set {
		mb, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		switch {
		case err != nil:
			bad = append(bad, fmt.Errorf("limits: %s=%q ignored: want a whole number of MB (2^20 bytes), as Lambda sets it", lambdaMemoryEnv, v))
		case mb <= 0 || mb > maxDeclared>>20:
			bad = append(bad, fmt.Errorf("limits: %s=%q ignored: want from 1 to %d MB (2^20 bytes)", lambdaMemoryEnv, v, int64(maxDeclared>>20)))
		case mb<<20 <= rss:
			bad = append(bad, fmt.Errorf("limits: %s=%q ignored: %w", lambdaMemoryEnv, v, underRSS(mb<<20, rss, false)))
		default:
			return declared{mb << 20, lambdaMemoryEnv, v, SourceLambda}, true, bad
		}
	}
	return declared{}, false, bad
}

// underRSS is the error of a declared limit not over rss; digits: no unit.
func underRSS(n, rss int64, digits bool) error {
	hint := ""
	if digits {
		hint = fmt.Sprintf(" (a number without a unit is bytes: %q for MiB)", strconv.FormatInt(n, 10)+"MiB")
	}
	return fmt.Errorf("a limit of %d bytes, not over the %s this process already holds (RssAnon + RssShmem)%s", n, logattr.MiB(rss), hint)
}

// sizeUnits are the suffixes parseSize takes, longest first.
var sizeUnits = []struct {
	suffix string
	shift  uint
}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"Ti", 40}, {"Gi", 30}, {"Mi", 20}, {"Ki", 10}, {"B", 0}}

// parseSize parses a byte count: decimal bytes, or a number with a suffix
// of sizeUnits (case-insensitive), from 1 byte to maxDeclared.
func parseSize(v string) (int64, error) {
	s := strings.TrimSpace(v)
	num, shift := s, uint(0)
	for _, u := range sizeUnits {
		if len(s) > len(u.suffix) && strings.EqualFold(s[len(s)-len(u.suffix):], u.suffix) {
			num, shift = strings.TrimSpace(s[:len(s)-len(u.suffix)]), u.shift
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	switch {
	case err != nil && strings.HasPrefix(num, "-"), err == nil && n < 0:
		return 0, fmt.Errorf("a negative size")
	case err != nil && num != "" && strings.Trim(num, "0123456789") == "":
		return 0, fmt.Errorf("over %d bytes", int64(maxDeclared))
	case err != nil:
		return 0, fmt.Errorf("want bytes (\"536870912\", as the downward API writes limits.memory) or a size such as \"512MiB\" (B, KiB, MiB, GiB, TiB; Ki, Mi, Gi, Ti)")
	case n == 0:
		return 0, fmt.Errorf("a limit of 0 bytes")
	case n > maxDeclared>>shift:
		return 0, fmt.Errorf("over %d bytes", int64(maxDeclared))
	}
	return n << shift, nil
}

func signedMiB(n int64) string {
	if n < 0 {
		return "-" + logattr.MiB(-n)
	}
	return logattr.MiB(n)
}

// chargeDir returns the cgroup directory charged against file's limit; ""
// for total memory and a declared limit.
func (f found) chargeDir(file string) string {
	if file == "" || file == f.decl {
		return ""
	}
	return filepath.Dir(file)
}

// sourceOf returns the Source of the hard limit of file.
func (f found) sourceOf(file string) Source {
	if f.decl != "" && file == f.decl {
		return f.declSource
	}
	if f.cgSource != SourceNone {
		return f.cgSource
	}
	return f.source
}
