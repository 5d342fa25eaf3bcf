package limits

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/childtest"
)

func init() {
	// memlimitlog is the memlimit child with a JSON logger on stderr.
	children["memlimitlog"] = func() {
		_, d, err := NewMemLimiter(MemLimitConfig{Logger: slog.New(slog.NewJSONHandler(os.Stderr, nil))})
		if err != nil {
			childtest.Fail("%v", err)
		}
		childtest.Say("BYTES", d.GoMemLimit)
		childtest.Say("READBACK", debug.SetMemoryLimit(-1))
		childtest.Say("LIMIT", d.MemoryLimit)
		childtest.Say("SOURCE", d.Source)
		childtest.Say("OUTSIDE", d.Outside)
		childtest.Say("FILE", d.File)
		childtest.Say("REASON", d.Reason)
	}
}

// texts returns each record's message and attributes as one line.
func (r *recorder) texts(level slog.Level) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, rec := range r.recs {
		if rec.Level != level {
			continue
		}
		var b strings.Builder
		b.WriteString(rec.Message)
		rec.Attrs(func(a slog.Attr) bool {
			fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
			return true
		})
		out = append(out, b.String())
	}
	return out
}

// noLimitV2 is a cgroup v2 process whose cgroup and ancestors set none,
// up to the hierarchy's root.
func noLimitV2() (cgroupfs.Limit, error) {
	return cgroupfs.Limit{Version: 2, Cgroup: "/app", Dir: "/sys/fs/cgroup/app", Bytes: cgroupfs.NoLimit, Max: cgroupfs.NoLimit, High: cgroupfs.NoLimit}, nil
}

// TestDeclaredLimit (issue 27 item 8): no cgroup limit, MEMCTL_MEMORY_LIMIT
// set to 512MiB (or to the bytes the downward API writes, or Lambda's
// variable to 512): GOMEMLIMIT is what a 512 MiB cgroup gives (ratio 0.9,
// the same headroom), and its source is named in MemLimit, the reason and
// File.
func TestDeclaredLimit(t *testing.T) {
	keepMemoryLimit(t)
	_, cg, err := start(t, cfgFor(fixedLimit(2, 512<<20)))
	require.NoError(t, err)
	require.Equal(t, ninetyPct(512<<20), cg.GoMemLimit, "the 512 MiB cgroup control")
	for _, tc := range []struct {
		name, value string
		src         Source
	}{
		{declaredLimitEnv, "512MiB", SourceDeclared},
		{declaredLimitEnv, "536870912", SourceDeclared}, // the downward API's limits.memory
		{declaredLimitEnv, " 512mib ", SourceDeclared},
		{declaredLimitEnv, "512Mi", SourceDeclared},
		{declaredLimitEnv, "524288KiB", SourceDeclared},
		{lambdaMemoryEnv, "512", SourceLambda},
	} {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			keepMemoryLimit(t)
			t.Setenv(tc.name, tc.value)
			rec := &recorder{}
			cfg := cfgFor(noLimitV2)
			cfg.Logger = slog.New(rec)
			_, d, err := start(t, cfg)
			require.NoError(t, err)
			assert.Equal(t, cg.GoMemLimit, d.GoMemLimit, "as for a 512 MiB cgroup: %s", d.Reason)
			assert.Equal(t, d.GoMemLimit, debug.SetMemoryLimit(-1))
			assert.Equal(t, int64(512<<20), d.MemoryLimit)
			assert.Equal(t, tc.src, d.Source)
			assert.Equal(t, tc.name+"="+strings.TrimSpace(tc.value), d.File)
			assert.Contains(t, d.Reason, tc.src.String())
			assert.Contains(t, d.Reason, tc.name)
			assert.Contains(t, d.Reason, "no cgroup memory limit", "the reason says why the cgroup gave none")
			assert.False(t, d.LimitUnknown)
			assert.Empty(t, rec.texts(slog.LevelWarn))
		})
	}
}

// TestDeclaredBesideCgroup: a cgroup limit and a declared one both bind;
// the smaller is followed, and named.
func TestDeclaredBesideCgroup(t *testing.T) {
	for _, tc := range []struct {
		cgroup int64
		src    Source
		want   int64
	}{
		{256 << 20, SourceCgroupV2, 256 << 20},
		{gib, SourceDeclared, 512 << 20},
	} {
		t.Run(strconv.FormatInt(tc.cgroup>>20, 10)+"MiB", func(t *testing.T) {
			keepMemoryLimit(t)
			t.Setenv(declaredLimitEnv, "512MiB")
			_, d, err := start(t, cfgFor(fixedLimit(2, tc.cgroup)))
			require.NoError(t, err)
			assert.Equal(t, tc.src, d.Source, d.Reason)
			assert.Equal(t, tc.want, d.MemoryLimit)
			assert.Equal(t, ninetyPct(tc.want), d.GoMemLimit)
		})
	}
	// MEMCTL_MEMORY_LIMIT wins over Lambda's variable.
	keepMemoryLimit(t)
	t.Setenv(declaredLimitEnv, "256MiB")
	t.Setenv(lambdaMemoryEnv, "512")
	_, d, err := start(t, cfgFor(noLimitV2))
	require.NoError(t, err)
	assert.Equal(t, SourceDeclared, d.Source)
	assert.Equal(t, int64(256<<20), d.MemoryLimit)
}

// TestDeclaredWhereUnknown: where the cgroup limit is unknown (a cgroup no
// mount shows, a namespace's top that is not the root) the reason says so
// and names MEMCTL_MEMORY_LIMIT as the remedy, never GOMEMLIMIT at the
// limit; with the variable set, it is followed. A cgroup read that fails
// is a WARN, and the declared limit stands.
func TestDeclaredWhereUnknown(t *testing.T) {
	unseen := func() (cgroupfs.Limit, error) {
		return cgroupfs.Limit{}, fmt.Errorf("%w: v2: cgroup \"/pod\" is outside the mounted part of the hierarchy", cgroupfs.ErrUnseen)
	}
	top := func() (cgroupfs.Limit, error) {
		l, _ := noLimitV2()
		l.TopNotRoot = true
		return l, nil
	}
	denied := func() (cgroupfs.Limit, error) {
		return cgroupfs.Limit{}, fmt.Errorf("cgroupfs: open \"/sys/fs/cgroup/app/memory.max\": %w", fs.ErrPermission)
	}
	for name, read := range map[string]func() (cgroupfs.Limit, error){"unseen": unseen, "top not root": top} {
		t.Run(name, func(t *testing.T) {
			keepMemoryLimit(t)
			debug.SetMemoryLimit(77 << 20)
			_, d, err := start(t, cfgFor(read))
			require.NoError(t, err)
			assert.Equal(t, SourceNone, d.Source)
			assert.True(t, d.LimitUnknown)
			assert.Contains(t, d.Reason, "unknown")
			assert.Contains(t, d.Reason, declaredLimitEnv)
			assert.NotContains(t, d.Reason, "no cgroup memory limit:", "never \"none\"")
			assert.NotContains(t, d.Reason, "set GOMEMLIMIT", "not the remedy that leads to GOMEMLIMIT at the limit")
			assert.Equal(t, int64(77<<20), debug.SetMemoryLimit(-1), "left as it was")

			t.Setenv(declaredLimitEnv, "512MiB")
			_, d, err = start(t, cfgFor(read))
			require.NoError(t, err)
			assert.Equal(t, SourceDeclared, d.Source)
			assert.False(t, d.LimitUnknown)
			assert.Equal(t, ninetyPct(512<<20), d.GoMemLimit)
		})
	}
	keepMemoryLimit(t)
	t.Setenv(declaredLimitEnv, "512MiB")
	rec := &recorder{}
	cfg := cfgFor(denied)
	cfg.Logger = slog.New(rec)
	_, d, err := start(t, cfg)
	require.NoError(t, err)
	assert.Equal(t, SourceDeclared, d.Source)
	assert.Equal(t, ninetyPct(512<<20), d.GoMemLimit)
	w := rec.texts(slog.LevelWarn)
	require.Len(t, w, 1)
	assert.Contains(t, w[0], "/sys/fs/cgroup/app/memory.max")
}

// TestDeclaredBadValues: a bad value (negative, 0, overflowing, garbage) is
// a WARN naming the variable and quoting the value, and is ignored:
// GOMEMLIMIT as without it.
func TestDeclaredBadValues(t *testing.T) {
	for _, tc := range []struct{ name, value, want string }{
		{declaredLimitEnv, "-1", "negative"},
		{declaredLimitEnv, "-512MiB", "negative"},
		{declaredLimitEnv, "0", "0 bytes"},
		{declaredLimitEnv, "0MiB", "0 bytes"},
		{declaredLimitEnv, "99999999999999999999", "over"},
		{declaredLimitEnv, "8388608TiB", "over"},
		{declaredLimitEnv, "4611686018427387905", "over"},
		{declaredLimitEnv, "512MB", "want bytes"},
		{declaredLimitEnv, "1e9", "want bytes"},
		{declaredLimitEnv, "lots", "want bytes"},
		{declaredLimitEnv, "0x100000", "want bytes"},
		{declaredLimitEnv, "MiB", "want bytes"},
		{declaredLimitEnv, "512 MiB of it", "want bytes"},
		{declaredLimitEnv, "512.5MiB", "want bytes"},
		{lambdaMemoryEnv, "0", "from 1"},
		{lambdaMemoryEnv, "-128", "from 1"},
		{lambdaMemoryEnv, "512MB", "whole number"},
		{lambdaMemoryEnv, "99999999999999999999", "whole number"},
		{lambdaMemoryEnv, "8796093022209", "from 1"},
	} {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			keepMemoryLimit(t)
			t.Setenv(tc.name, tc.value)
			rec := &recorder{}
			cfg := cfgFor(fixedLimit(2, gib))
			cfg.Logger = slog.New(rec)
			_, d, err := start(t, cfg)
			require.NoError(t, err)
			assert.Equal(t, SourceCgroupV2, d.Source, "ignored")
			assert.Equal(t, ninetyPct(gib), d.GoMemLimit)
			w := rec.texts(slog.LevelWarn)
			require.Len(t, w, 1, "one WARN")
			assert.Contains(t, w[0], tc.name)
			assert.Contains(t, w[0], strconv.Quote(strings.TrimSpace(tc.value)))
			assert.Contains(t, w[0], tc.want)
			assert.Contains(t, w[0], "ignored")
		})
	}
	// Empty is unset: nothing said.
	keepMemoryLimit(t)
	t.Setenv(declaredLimitEnv, "")
	rec := &recorder{}
	cfg := cfgFor(fixedLimit(2, gib))
	cfg.Logger = slog.New(rec)
	_, d, err := start(t, cfg)
	require.NoError(t, err)
	assert.Equal(t, SourceCgroupV2, d.Source)
	assert.Empty(t, rec.texts(slog.LevelWarn))
}

// TestDeclaredLimitChild (issue 27 item 8): a child in a cgroup that sets
// no limit (this test process's own, when it sets none) with
// MEMCTL_MEMORY_LIMIT=512MiB, and with AWS_LAMBDA_FUNCTION_MEMORY_SIZE=512:
// GOMEMLIMIT as for a 512 MiB cgroup (0.9 of it less what the child holds
// outside the Go runtime), the source named; without them the control
// leaves GOMEMLIMIT unset.
func TestDeclaredLimitChild(t *testing.T) {
	if l, err := cgroupfs.Of(0); err == nil && l.Bytes != cgroupfs.NoLimit {
		t.Skipf("this process's cgroup sets a limit (%d bytes, %s): the child needs one that sets none", l.Bytes, l.File)
	}
	unset := []string{"GOMEMLIMIT", "AUTOMEMLIMIT", declaredLimitEnv, lambdaMemoryEnv}
	r, _ := reportAndWarns(t, childtest.Command(t, "memlimitlog", unset))
	assert.Equal(t, "none", r["SOURCE"], "the control: no limit")
	assert.Equal(t, strconv.FormatInt(1<<63-1, 10), r["READBACK"])
	for _, tc := range []struct{ env, source, file string }{
		{declaredLimitEnv + "=512MiB", "declared", declaredLimitEnv + "=512MiB"},
		{lambdaMemoryEnv + "=512", "lambda", lambdaMemoryEnv + "=512"},
	} {
		r, warns := reportAndWarns(t, childtest.Command(t, "memlimitlog", unset, tc.env))
		assert.Empty(t, warns)
		outside := childtest.RequireInt(t, r, "OUTSIDE")
		assert.Less(t, outside, int64(32<<20), "a pure Go child holds little outside the Go runtime")
		want := strconv.FormatInt(ninetyPct(512<<20)-outside, 10)
		assert.Equal(t, want, r["READBACK"], tc.env)
		assert.Equal(t, strconv.Itoa(512<<20), r["LIMIT"])
		assert.Equal(t, tc.source, r["SOURCE"])
		assert.Equal(t, tc.file, r["FILE"])
		t.Logf("%s: GOMEMLIMIT %s, %s", tc.env, r["READBACK"], r["REASON"])
	}
}

// reportAndWarns runs cmd and returns its report and its WARN records.
func reportAndWarns(t *testing.T, cmd *exec.Cmd) (map[string]string, []map[string]any) {
	t.Helper()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, stderr.String())
	var warns []map[string]any
	sc := bufio.NewScanner(&stderr)
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["level"] == "WARN" {
			warns = append(warns, rec)
		}
	}
	return childtest.ParseReport(out), warns
}

// TestDeclaredUnderRSS: a declared limit the process already uses more
// than (MEMCTL_MEMORY_LIMIT=512, bytes written for MiB) is a bad value,
// said at WARN and ignored: the cgroup's 1 GiB limit is followed. It was
// taken as the tightest hard limit, found implausible, and NewMemLimiter
// failed with GOMEMLIMIT left unset, the cgroup's limit not followed and
// nothing logged.
func TestDeclaredUnderRSS(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		warn []string
		src  Source
		want int64
	}{
		{map[string]string{declaredLimitEnv: "512"}, []string{declaredLimitEnv, `"512"`, "ignored", "RssAnon + RssShmem", `"512MiB"`}, SourceCgroupV2, gib},
		{map[string]string{declaredLimitEnv: "1MiB"}, []string{declaredLimitEnv, `"1MiB"`, "ignored", "RssAnon + RssShmem"}, SourceCgroupV2, gib},
		{map[string]string{declaredLimitEnv: "32MiB"}, []string{declaredLimitEnv, "ignored", "RssAnon + RssShmem"}, SourceCgroupV2, gib},
		{map[string]string{lambdaMemoryEnv: "16"}, []string{lambdaMemoryEnv, `"16"`, "ignored", "RssAnon + RssShmem"}, SourceCgroupV2, gib},
		{map[string]string{declaredLimitEnv: "512", lambdaMemoryEnv: "512"}, []string{declaredLimitEnv, "ignored"}, SourceLambda, 512 << 20},
	} {
		t.Run(fmt.Sprint(tc.env), func(t *testing.T) {
			keepMemoryLimit(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			rec := &recorder{}
			cfg := cfgFor(fixedLimit(2, gib))
			cfg.Logger = slog.New(rec)
			_, d, err := start(t, cfg)
			require.NoError(t, err, "the cgroup's limit is followed")
			assert.Equal(t, tc.src, d.Source, d.Reason)
			assert.Equal(t, tc.want, d.MemoryLimit)
			assert.Equal(t, ninetyPct(tc.want), d.GoMemLimit)
			assert.Equal(t, d.GoMemLimit, debug.SetMemoryLimit(-1))
			w := rec.texts(slog.LevelWarn)
			require.Len(t, w, 1, "one WARN")
			for _, s := range tc.warn {
				assert.Contains(t, w[0], s)
			}
		})
	}
	// Alone (no cgroup limit): ignored, GOMEMLIMIT left as it was, no error.
	prev := keepMemoryLimit(t)
	t.Setenv(declaredLimitEnv, "512")
	rec := &recorder{}
	cfg := cfgFor(noLimitV2)
	cfg.Logger = slog.New(rec)
	_, d, err := start(t, cfg)
	require.NoError(t, err)
	assert.Equal(t, SourceNone, d.Source, d.Reason)
	assert.Equal(t, prev, debug.SetMemoryLimit(-1))
	assert.Len(t, rec.texts(slog.LevelWarn), 1)
	// Just over the RSS: taken (the operator said so), at the limit itself.
	keepMemoryLimit(t)
	t.Setenv(declaredLimitEnv, "33MiB")
	_, d, err = start(t, cfgFor(fixedLimit(2, gib)))
	require.NoError(t, err)
	assert.Equal(t, SourceDeclared, d.Source, d.Reason)
}

// TestDeclaredHostileValues: more bad values (overflowing in every form,
// "max", signs, a Lambda size whose bytes overflow int64) are each one
// WARN, ignored; odd but valid spellings are taken.
func TestDeclaredHostileValues(t *testing.T) {
	for _, tc := range []struct{ name, value, want string }{
		{declaredLimitEnv, "9223372036854775807", "over"},
		{declaredLimitEnv, "9223372036854775808", "over"},
		{declaredLimitEnv, "99999999999999999999Mi", "over"},
		{declaredLimitEnv, "4194305TiB", "over"},
		{declaredLimitEnv, "1e30", "want bytes"},
		{declaredLimitEnv, "max", "want bytes"},
		{declaredLimitEnv, "-0", "0 bytes"},
		{declaredLimitEnv, "+-5MiB", "want bytes"},
		{declaredLimitEnv, "-99999999999999999999", "negative"},
		{declaredLimitEnv, "512 Mi B", "want bytes"},
		{declaredLimitEnv, "１２MiB", "want bytes"},
		{lambdaMemoryEnv, "9223372036854775807", "from 1"},
		{lambdaMemoryEnv, "4398046511105", "from 1"},
		{lambdaMemoryEnv, "512.5", "whole number"},
		{lambdaMemoryEnv, "max", "whole number"},
	} {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			keepMemoryLimit(t)
			t.Setenv(tc.name, tc.value)
			rec := &recorder{}
			cfg := cfgFor(fixedLimit(2, gib))
			cfg.Logger = slog.New(rec)
			_, d, err := start(t, cfg)
			require.NoError(t, err)
			assert.Equal(t, SourceCgroupV2, d.Source, "ignored")
			assert.Equal(t, ninetyPct(gib), d.GoMemLimit)
			w := rec.texts(slog.LevelWarn)
			require.Len(t, w, 1, "one WARN")
			assert.Contains(t, w[0], strconv.Quote(tc.value))
			assert.Contains(t, w[0], tc.want)
			assert.Contains(t, w[0], "ignored")
		})
	}
	for _, tc := range []struct {
		name, value string
		bytes       int64
	}{
		{declaredLimitEnv, "\t512MIB\n", 512 << 20},
		{declaredLimitEnv, "+512mi", 512 << 20},
		{declaredLimitEnv, "0000000000000000000000000512MiB", 512 << 20},
		{declaredLimitEnv, "4194304TiB", 1 << 62},
		{lambdaMemoryEnv, " 512 ", 512 << 20},
		{lambdaMemoryEnv, "4398046511104", 1 << 62},
	} {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			keepMemoryLimit(t)
			t.Setenv(tc.name, tc.value)
			_, d, err := start(t, cfgFor(noLimitV2))
			require.NoError(t, err)
			assert.Equal(t, tc.bytes, d.MemoryLimit, d.Reason)
			assert.Equal(t, d.GoMemLimit, debug.SetMemoryLimit(-1))
			assert.Positive(t, d.GoMemLimit)
		})
	}
}
