package main

// Issue 22: memctl status shows what the memctl library inside a process
// decided (its state record), as reported by the process, and treats a
// forged record as the untrusted input it is.

import (
	"bufio"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	memctllib "github.com/memctl/memctl"
	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/internal/state"
	"github.com/memctl/memctl/limits"
)

var sink []byte

// serviceChild is a small service: it calls Start, opens a budget pool,
// serves one 64 MiB burst and waits for its trim, then says what Start
// decided, READY, and waits until its standard input is closed.
func serviceChild() {
	ctl, err := memctllib.Start(memctllib.WithLogger(slog.New(slog.DiscardHandler)), memctllib.WithTrimDelay(20*time.Millisecond))
	if err != nil {
		childtest.Fail("Start: %v", err)
	}
	defer ctl.Close()
	pool, err := limits.NewPool(limits.PoolConfig{Name: "api", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		childtest.Fail("NewPool: %v", err)
	}
	defer pool.Close()
	for range 8 {
		sink = make([]byte, 8<<20)
		for i := 0; i < len(sink); i += 4096 {
			sink[i] = 1
		}
	}
	sink = nil
	ctl.AfterBurst()
	for deadline := time.Now().Add(20 * time.Second); ctl.Stats().Trim.Trims == 0; {
		if time.Now().After(deadline) {
			childtest.Fail("no trim in 20 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Requests: peaks of 1 and 3 MiB, and one refused by its own 1 MiB
	// budget; the next GC end publishes them.
	for _, n := range []int64{1 << 20, 3 << 20} {
		a, err := pool.Open("req", limits.Unlimited)
		if err != nil {
			childtest.Fail("Open: %v", err)
		}
		_ = a.Grow(n)
		a.Close()
	}
	small, err := pool.Open("small", 1<<20)
	if err != nil {
		childtest.Fail("Open: %v", err)
	}
	if small.Grow(2<<20) == nil {
		childtest.Fail("2 MiB in a 1 MiB account was not refused")
	}
	small.Close()
	runtime.GC()
	ml := ctl.Report().MemLimit
	s := ctl.Stats().Trim
	ps := pool.Stats()
	childtest.Say("PEAKS", ps.Peaks.Count)
	childtest.Say("P99", ps.Peaks.Quantile(0.99))
	childtest.Say("DEBOUNCED", s.Debounced.Trims)
	if h := ctl.Stats().CHeaps; len(h) > 0 {
		childtest.Say("CHEAP", h[0].Allocator)
	}
	childtest.Say("GOMEMLIMIT", ml.GoMemLimit)
	childtest.Say("SOURCE", ml.Source.String())
	childtest.Say("FILE", ml.File)
	childtest.Say("TRIMS", s.Trims)
	childtest.Say("SKIPPED", s.Skipped)
	childtest.Say("POOL_LIMIT", pool.Limit())
	childtest.Say("THP_POLICY", ctl.Report().THPPolicy.String())
	childtest.Say("PID", os.Getpid())
	childtest.Say("READY", 1)
	_, _ = io.ReadAll(os.Stdin)
}

// forgeChild publishes a forged record: a memfd named as the library's
// holding the file MEMCTL_TEST_FORGE names, stretched to MEMCTL_TEST_FORGE_SIZE
// bytes when that is set; then READY, and it waits for its standard input.
func forgeChild() {
	b, err := os.ReadFile(os.Getenv("MEMCTL_TEST_FORGE"))
	if err != nil {
		childtest.Fail("MEMCTL_TEST_FORGE: %v", err)
	}
	fd, err := unix.MemfdCreate(state.MemfdName, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		childtest.Fail("memfd_create: %v", err)
	}
	if _, err := unix.Write(fd, b); err != nil {
		childtest.Fail("write: %v", err)
	}
	if n := os.Getenv("MEMCTL_TEST_FORGE_SIZE"); n != "" {
		size, _ := strconv.ParseInt(n, 10, 64)
		if err := unix.Ftruncate(fd, size); err != nil {
			childtest.Fail("ftruncate: %v", err)
		}
	}
	if os.Getenv("MEMCTL_TEST_FORGE_NOSEAL") == "" {
		// Sealed as the library seals it; a forger can do the same.
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_WRITE|unix.F_SEAL_GROW|unix.F_SEAL_SHRINK); err != nil {
			childtest.Fail("seal: %v", err)
		}
	}
	childtest.Say("PID", os.Getpid())
	childtest.Say("UID", os.Getuid())
	childtest.Say("READY", 1)
	_, _ = io.ReadAll(os.Stdin)
	runtime.KeepAlive(fd)
}

// nobodyRun holds a copy of the test binary that nobody (65534) may run,
// in a directory nobody may read (and find the forged records in).
type nobodyRun struct{ dir, exe string }

// nobodyCopy returns a nobodyRun when the test runs as root, else nil (the
// children then run as the test's own user). The copy is removed when t
// ends.
func nobodyCopy(t *testing.T) *nobodyRun {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil
	}
	exe, err := os.Executable()
	require.NoError(t, err)
	dir, err := os.MkdirTemp("", "memctl-i22-forger-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	b, err := os.ReadFile(exe)
	require.NoError(t, err)
	cp := filepath.Join(dir, "memctl.test")
	require.NoError(t, os.WriteFile(cp, b, 0o755))
	return &nobodyRun{dir: dir, exe: cp}
}

// wrap makes cmd run the copy as nobody; on a nil nobodyRun it does
// nothing.
func (n *nobodyRun) wrap(cmd *exec.Cmd) {
	if n == nil {
		return
	}
	cmd.Path, cmd.Args[0], cmd.Dir = n.exe, n.exe, n.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
}

// startReady starts cmd, waits until it says READY and returns its report.
// The child's standard input is closed when the test ends.
func startReady(t *testing.T, cmd *exec.Cmd) map[string]string {
	t.Helper()
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("%s child: %v", cmd.Env, err)
		}
	})
	lines := make(chan map[string]string, 1)
	go func() {
		r := map[string]string{}
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			for k, v := range childtest.ParseReport([]byte(sc.Text())) {
				r[k] = v
			}
			if r["READY"] != "" {
				break
			}
		}
		lines <- r
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case r := <-lines:
		require.NotEmpty(t, r["READY"], "child report: %v", r)
		return r
	case <-time.After(60 * time.Second):
		t.Fatal("child did not get ready in 60 s")
	}
	return nil
}

// TestStatusShowsLibraryRecord is issue 22's first check: a service that
// called Start in a 256 MiB cgroup; status and status -json show the
// GOMEMLIMIT the library set, its source and the trims, labeled as reported
// by the process.
func TestStatusShowsLibraryRecord(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a service in a cgroup (-short)")
	}
	g := cgrouptest.New(t, 256<<20)
	cmd := childtest.Command(t, "service", operatorVars)
	g.Wrap(cmd)
	rep := startReady(t, cmd)
	pid := rep["PID"]
	gml := childtest.RequireInt(t, rep, "GOMEMLIMIT")
	require.Equal(t, "cgroup v"+strconv.Itoa(g.Version), rep["SOURCE"], "Start took GOMEMLIMIT from the cgroup")
	assert.Greater(t, gml, int64(200<<20))
	assert.LessOrEqual(t, gml, int64(241591910), "0.9 of 256 MiB less what is outside the Go runtime")
	trims := childtest.RequireInt(t, rep, "TRIMS")
	require.Positive(t, trims)

	// The pool's counters reach the record at a GC end after the child's
	// requests: wait for them (the child ran a GC before READY; its
	// runtime runs more).
	var out string
	var doc statusReport
	for deadline := time.Now().Add(30 * time.Second); ; {
		var code int
		out, _, code = result(t, memctl(t, nil, "status", "-json", "-pid", pid))
		require.Equal(t, 0, code)
		doc = statusReport{}
		require.NoError(t, json.Unmarshal([]byte(out), &doc))
		require.NotNil(t, doc.Memctl, "the record")
		if len(doc.Memctl.Pools) == 1 && doc.Memctl.Pools[0].Refused == 1 && strconv.FormatInt(doc.Memctl.Pools[0].Peaks.Count, 10) == rep["PEAKS"] {
			break
		}
		require.True(t, time.Now().Before(deadline), "the record never showed the pool's requests: %+v", doc.Memctl.Pools)
		time.Sleep(50 * time.Millisecond)
	}
	assert.Empty(t, doc.Unknown)
	m := doc.Memctl
	assert.Equal(t, "process", m.ReportedBy)
	assert.Regexp(t, `^/proc/`+pid+`/fd/\d+$`, m.File)
	require.NotNil(t, m.GoMemLimit.Bytes)
	assert.Equal(t, gml, *m.GoMemLimit.Bytes)
	assert.Equal(t, rep["SOURCE"], m.GoMemLimit.Source)
	assert.Equal(t, rep["FILE"], m.GoMemLimit.File)
	assert.Equal(t, int64(256<<20), m.GoMemLimit.MemoryLimitBytes)
	assert.GreaterOrEqual(t, m.Trim.Trims, trims)
	assert.Equal(t, 0.02, m.Trim.DelaySeconds)
	require.Len(t, m.Pools, 1)
	assert.Equal(t, "api", m.Pools[0].Name)
	require.NotNil(t, m.Pools[0].LimitBytes)
	assert.Equal(t, rep["POOL_LIMIT"], strconv.FormatInt(*m.Pools[0].LimitBytes, 10))
	assert.Equal(t, rep["THP_POLICY"], m.THP.Policy, "the policy Start applied (except-advised on 6.18+)")
	// What issues 17-21 added: trims by origin, the pool's peaks and
	// refusals, the C heaps, limit_unknown.
	debounced := childtest.RequireInt(t, rep, "DEBOUNCED")
	assert.GreaterOrEqual(t, m.Trim.Origins.Debounced.Trims, max(debounced, 1), "the AfterBurst trim is debounced")
	pk := m.Pools[0].Peaks
	assert.Equal(t, rep["P99"], strconv.FormatInt(pk.P99Bytes, 10))
	assert.Equal(t, int64(4<<20), pk.MaxBytes, "the 3 MiB request is in the (2, 4] MiB bucket")
	assert.Len(t, pk.Counts, state.PeakCounts)
	assert.False(t, m.GoMemLimit.LimitUnknown)
	if rep["CHEAP"] != "" {
		require.NotEmpty(t, m.CHeaps)
		assert.Equal(t, rep["CHEAP"], m.CHeaps[0].Allocator)
		assert.True(t, m.CHeaps[0].OwnsMalloc)
	}
	// Swap (issue 25 item 6): the process's VmSwap and its cgroup's swap
	// files, read by status from the kernel and reported in the record;
	// GOMEMLIMIT is from the memory limit alone (asserted above).
	require.NotNil(t, doc.VmSwapBytes)
	require.NotNil(t, m.Swap, "the record has swap")
	require.NotNil(t, m.Swap.VmSwapBytes)
	swapCur, _ := cgroupfs.SwapFiles(g.Version)
	if doc.Cgroup.Swap == nil {
		assert.Contains(t, doc.Cgroup.SwapNote, "does not account swap")
		assert.Equal(t, 0, m.Swap.CgroupVersion)
		t.Logf("cgroup v%d without swap accounting: %s", g.Version, doc.Cgroup.SwapNote)
	} else {
		assert.Equal(t, filepath.Join(g.Dir, swapCur), doc.Cgroup.Swap.CurrentFile)
		assert.Equal(t, g.Version == 1, doc.Cgroup.Swap.MemoryPlusSwap)
		assert.Equal(t, g.Version, m.Swap.CgroupVersion)
		assert.Equal(t, filepath.Join(g.Dir, swapCur), m.Swap.File)
		require.NotNil(t, m.Swap.CurrentBytes)
		if g.Version == 1 {
			assert.Positive(t, doc.Cgroup.Swap.CurrentBytes, "memsw counts the service's memory")
		}
	}
	var raw struct{ Memctl map[string]any }
	require.NoError(t, json.Unmarshal([]byte(out), &raw))
	assert.Equal(t, "process", raw.Memctl["reported_by"], "the key is in the document")
	assert.Equal(t, float64(state.Version), raw.Memctl["version"])

	out, _, code := result(t, memctl(t, nil, "status", "-pid", pid))
	require.Equal(t, 0, code)
	assert.Regexp(t, `(?m)^  trims by origin +debounced [1-9]\d* run, \d+ skipped, .*; pressure \d+ run, .*; spiral \d+ run, .*; by name \d+ run, `, out)
	assert.Regexp(t, `(?m)^  trims skipped by +min_release \d+ .*, cost \d+ .*, budget \d+ .*, running \d+ `, out)
	assert.Regexp(t, `(?m)^  auto-burst +\d+ bursts detected at GC end, `, out)
	assert.Regexp(t, `(?m)^ +request peaks: `+rep["PEAKS"]+`, p50 <= \d+ bytes .*, max <= 4194304 bytes \(4\.0 MiB\)$`, out)
	assert.Regexp(t, `(?m)^  pressure +"[^"]+"; \d+ signals, \d+ acted on, \d+ left to the kernel`, out)
	if rep["CHEAP"] != "" {
		assert.Regexp(t, `(?m)^  C heaps +"`+rep["CHEAP"]+`" in "[^"]*", owns malloc, `, out)
	}
	assert.Regexp(t, `(?m)^memctl +reported by the process \(not checked\): record "/proc/`+pid+`/fd/\d+", version 1, `, out)
	file := strconv.Quote(filepath.Join(g.Dir, filepath.Base(rep["FILE"])))
	assert.Regexp(t, `(?m)^  GOMEMLIMIT +`+strconv.FormatInt(gml, 10)+` bytes \(\d+\.\d MiB\); source "cgroup v\d" `+regexpQuote(file)+`, 0\.90 of 268435456 bytes`, out)
	assert.Regexp(t, `(?m)^  trims +`+strconv.FormatInt(m.Trim.Trims, 10)+` run, \d+ skipped`, out)
	assert.Regexp(t, `(?m)^  pools +"api" "enforce", limit \d+ bytes .*; 1 refused, 0 observed, 0 canceled$`, out)
	assert.Regexp(t, `(?m)^  swap +VmSwap \d+ bytes.*; as of the record's update$`, out)
	assert.Regexp(t, `(?m)^cgroup swap +`, out)
	assert.NotContains(t, out, "GOMEMLIMIT=", "the environment says nothing: the library decided")
}

func regexpQuote(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `.`, `\.`, `(`, `\(`, `)`, `\)`, `[`, `\[`, `+`, `\+`, `*`, `\*`, `?`, `\?`, `$`, `\$`, `^`, `\^`, `|`, `\|`)
	return r.Replace(s)
}

// TestStatusForgedRecord is issue 22's second check: a process forges the
// record. Wrong types, huge sizes and bad versions are rejected whole
// (unknown, exit status 3); escape sequences and long strings in a
// well-formed record are shown quoted and cut (exit status 0). The fields
// of issues 17-21 (trims by origin, skips by reason, auto-burst, pressure
// counters, C heaps, pool peaks and refusals, limit_unknown) are held to
// the same rules, and so are hostile encodings (deep nesting, NUL bytes,
// invalid UTF-8) and an unsealed memfd.
func TestStatusForgedRecord(t *testing.T) {
	long := strings.Repeat("A", 30<<10)
	esc := "\x1b[2J\x1b]0;owned\x07\u009b31m\u202eevil"
	valid := func(reason, source, pool string) string {
		return `{"version":1,"pid":1,"seq":1,"updated":"2026-12-01T10:00:00Z","gomemlimit":{"bytes":1,"source":` +
			jsonString(source) + `,"reason":` + jsonString(reason) + `},"trim":{"delay_seconds":2},"pools":[{"name":` +
			jsonString(pool) + `,"mode":"enforce","limit_bytes":5}],"pressure":{"source":"none"},"c_heap":"glibc","extra":{"ignored":true}}`
	}
	// rec is a record with what Publish always writes, and rest.
	rec := func(rest string) string {
		return `{"version":1,"pid":1,"seq":1,"updated":"2026-12-01T10:00:00Z",` + rest + `}`
	}
	zeros := strings.Repeat(",0", state.PeakCounts-2)
	// full holds every field of issues 17-21, with s in each string.
	full := func(s string) string {
		q := jsonString(s)
		return rec(`"gomemlimit":{"source":"none","limit_unknown":true,"reason":` + q + `},` +
			`"trim":{"delay_seconds":2,"trims":3,"origins":{"debounced":{"trims":1},"pressure":{"trims":1,"skipped":4},"spiral":{"trims":1},"by_name":{}},` +
			`"skipped_by":{"min_release":1,"cost":1,"budget":1,"running":1}},` +
			`"auto_burst":{"bursts":2,"marks":3,"floor_bytes":1048576,"gc_ends":9},` +
			`"pressure":{"source":` + q + `,"signals":5,"acted":1,"left_to_kernel":4},` +
			`"pools":[{"name":` + q + `,"mode":` + q + `,"refused":7,"undercharged":2,"peaks":{"count":3,"p50_bytes":65536,"p99_bytes":131072,"max_bytes":131072,"counts":[2,1` + zeros + `]}}],` +
			`"c_heap":` + q + `,"c_heaps":[{"allocator":` + q + `,"library":` + q + `,"note":` + q + `,"owns_malloc":true,"trimmed":false,"retained_bytes":-1}]`)
	}
	deep := strings.Repeat("[", 20000) + strings.Repeat("]", 20000)
	// The forger is what attacks the command: a process of another user
	// (nobody) when this test is root, as a container's process is to the
	// operator who runs memctl status on the node.
	forger := nobodyCopy(t)
	for name, tc := range map[string]struct {
		record string
		size   int64  // stretch the memfd to this size
		noseal bool   // leave the memfd writable
		code   int    // exit status
		reason string // in unknown["memctl"]
	}{
		"full":             {record: full("ok"), code: exitOK},
		"full escapes":     {record: full(esc), code: exitOK},
		"full long":        {record: full(long[:4000]), code: exitOK},
		"origin negative":  {record: rec(`"trim":{"origins":{"spiral":{"trims":-1}}}`), code: exitPartial, reason: "trim.origins.spiral.trims -1 is negative"},
		"origin wrong":     {record: rec(`"trim":{"origins":{"pressure":"\u001b[2J"}}`), code: exitPartial, reason: "cannot unmarshal"},
		"skip huge":        {record: rec(`"trim":{"skipped_by":{"cost":1e400}}`), code: exitPartial, reason: "cannot unmarshal"},
		"heaps too many":   {record: rec(`"c_heaps":[` + strings.Repeat(`{"allocator":"\u001b[2J"},`, 40) + `{}]`), code: exitPartial, reason: "41 c_heaps, more than 16"},
		"heap type":        {record: rec(`"c_heaps":[{"owns_malloc":"\u001b[2J"}]`), code: exitPartial, reason: "cannot unmarshal"},
		"peaks forged":     {record: rec(`"pools":[{"name":"api","peaks":{"count":3,"p50_bytes":1,"p99_bytes":1,"max_bytes":1,"counts":[2,1` + zeros + `]}}]`), code: exitPartial, reason: "pools[0].peaks: p50_bytes 1 is not 65536"},
		"peaks long list":  {record: rec(`"pools":[{"peaks":{"count":1,"counts":[` + strings.Repeat("0,", 5000) + `1]}}]`), code: exitPartial, reason: "5001 counts, want 22"},
		"unknown wrong":    {record: rec(`"gomemlimit":{"limit_unknown":1}`), code: exitPartial, reason: "cannot unmarshal"},
		"deep nesting":     {record: rec(`"extra":` + deep), code: exitPartial, reason: "exceeded max depth"},
		"raw NUL":          {record: rec(`"c_heap":"` + "\x00\x1b[2J" + `"`), code: exitPartial, reason: `invalid character '\\x00' in string literal`},
		"raw ESC":          {record: rec(`"c_heap":"` + "\xff\xfe\x1b" + `"`), code: exitPartial, reason: `invalid character '\\x1b' in string literal`},
		"NUL after":        {record: rec(`"c_heap":"ok"`) + "\x00", code: exitPartial, reason: `invalid character '\\x00' after top-level value`},
		"bad UTF-8 string": {record: rec(`"c_heap":"` + "\xff\xfe" + `","pools":[{"name":"` + "\xc3" + `"}]`), code: exitOK},
		"not published":    {record: `{"version":1}`, code: exitPartial, reason: "not a published record"},
		"not sealed":       {record: full("ok"), noseal: true, code: exitPartial, reason: "not a sealed memfd: seals 0x0, want 0xe"},
		"wrong type":       {record: `{"version":1,"gomemlimit":{"bytes":"9999999999999999999999"}}`, code: exitPartial, reason: "cannot unmarshal"},
		"wrong type nest":  {record: `{"version":1,"pools":[{"name":["\u001b[2J"]}]}`, code: exitPartial, reason: "cannot unmarshal"},
		"huge":             {record: `{"version":1}`, size: 1 << 40, code: exitPartial, reason: "file larger than the cap of 65536 bytes (1099511627776 bytes)"},
		"just too large":   {record: `{"version":1}`, size: state.MaxSize + 1, code: exitPartial, reason: "file larger than the cap"},
		"not JSON":         {record: "\x1b[2J\xff\xfe", code: exitPartial, reason: "invalid character"},
		"version":          {record: `{"version":"\u001b[2J` + long + `"}`, code: exitPartial, reason: "unknown record version"},
		"negative":         {record: rec(`"trim":{"trims":-1}`), code: exitPartial, reason: "trim.trims -1 is negative"},
		"escapes":          {record: valid(esc, esc, esc), code: exitOK},
		"long":             {record: valid(long, "cgroup v1", long), code: exitOK},
	} {
		t.Run(name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "record")
			if forger != nil {
				file = filepath.Join(forger.dir, strings.ReplaceAll(name, " ", "-")+".record")
			}
			require.NoError(t, os.WriteFile(file, []byte(tc.record), 0o644))
			env := []string{"MEMCTL_TEST_FORGE=" + file}
			if tc.size > 0 {
				env = append(env, "MEMCTL_TEST_FORGE_SIZE="+strconv.FormatInt(tc.size, 10))
			}
			if tc.noseal {
				env = append(env, "MEMCTL_TEST_FORGE_NOSEAL=1")
			}
			cmd := childtest.Command(t, "forge", operatorVars, env...)
			forger.wrap(cmd)
			rep := startReady(t, cmd)
			pid := rep["PID"]
			if forger != nil {
				require.Equal(t, "65534", rep["UID"], "the forger runs as nobody")
			}
			for _, args := range [][]string{{"-json"}, nil} {
				start := time.Now()
				out, errOut, code := result(t, memctl(t, nil, append([]string{"status", "-pid", pid}, args...)...))
				assert.Less(t, time.Since(start), 20*time.Second)
				assert.Equal(t, tc.code, code)
				assert.Empty(t, errOut)
				// Nothing unquoted: no control character, C1 control or
				// bidirectional override reaches the terminal.
				for _, bad := range []string{"\x1b", "\x07", "\u009b", "\u202e", "\xff"} {
					assert.NotContains(t, out, bad)
				}
				// Nothing unbounded: the output of a 64 KiB record, or
				// of a 1 TiB memfd, stays small.
				if args == nil {
					for line := range strings.SplitSeq(out, "\n") {
						assert.Less(t, len(line), 1200, "a table line: %.100q", line)
					}
				} else {
					assert.Less(t, len(out), 8*state.MaxSize)
				}
				if args == nil {
					if tc.code == exitOK {
						assert.Contains(t, out, "reported by the process (not checked)")
					} else {
						assert.Regexp(t, `(?m)^memctl +unknown: `, out)
					}
					if name == "escapes" || name == "full escapes" {
						assert.Contains(t, out, `"\x1b[2J\x1b]0;owned\a\u009b31m\u202eevil"`)
					}
					if strings.HasPrefix(name, "full") {
						assert.Regexp(t, `(?m)^  memory limit +unknown to the library`, out)
						assert.Regexp(t, `(?m)^  trims by origin +debounced 1 run, 0 skipped, .*; pressure 1 run, 4 skipped, `, out)
						assert.Regexp(t, `(?m)^  trims skipped by +min_release 1 .*, cost 1 .*, budget 1 .*, running 1 `, out)
						assert.Regexp(t, `(?m)^  auto-burst +2 bursts detected at GC end, 3 marked for a trim, `, out)
						assert.Regexp(t, `(?m)^ +request peaks: 3, p50 <= 65536 bytes \(64\.0 KiB\), p99 <= 131072 bytes \(128\.0 KiB\), max <= 131072 bytes \(128\.0 KiB\)$`, out)
						assert.Regexp(t, `(?m)^ +undercharged: 2 GC ends`, out)
						assert.Regexp(t, `(?m)^  pressure +".*"(\.\.\.\(\d+ bytes\))?; 5 signals, 1 acted on, 4 left to the kernel`, out)
						assert.Regexp(t, `(?m)^  C heaps +".*"(\.\.\.\(\d+ bytes\))? in ".*"(\.\.\.\(\d+ bytes\))?, owns malloc, not trimmed; 0 releases, 0 skipped, 0 bytes released; retained unknown; "`, out)
					}
					if name == "full long" {
						assert.Contains(t, out, `...(4000 bytes)`)
					}
					if name == "bad UTF-8 string" {
						assert.Contains(t, out, "\"\ufffd\ufffd\"", "replaced by the JSON decoder, shown quoted")
					}
					if name == "long" {
						assert.Contains(t, out, `...(30720 bytes)`)
					}
					continue
				}
				var doc statusReport
				require.NoError(t, json.Unmarshal([]byte(out), &doc))
				if tc.code == exitOK {
					require.NotNil(t, doc.Memctl)
					assert.Equal(t, "process", doc.Memctl.ReportedBy)
					if strings.HasPrefix(name, "full") {
						m := doc.Memctl
						assert.True(t, m.GoMemLimit.LimitUnknown)
						assert.Equal(t, int64(4), m.Trim.Origins.Pressure.Skipped)
						assert.Equal(t, int64(1), m.Trim.SkippedBy.Running)
						assert.Equal(t, int64(2), m.AutoBurst.Bursts)
						assert.Equal(t, int64(4), m.Pressure.LeftToKernel)
						require.Len(t, m.CHeaps, 1)
						assert.Equal(t, int64(-1), m.CHeaps[0].RetainedBytes)
						require.Len(t, m.Pools, 1)
						assert.Equal(t, int64(7), m.Pools[0].Refused)
						assert.Equal(t, int64(131072), m.Pools[0].Peaks.P99Bytes)
					}
					if name == "full escapes" {
						assert.Equal(t, esc, doc.Memctl.CHeaps[0].Library, "the value is unchanged, only escaped")
					}
					if name == "escapes" {
						assert.Equal(t, esc, doc.Memctl.GoMemLimit.Reason, "the value is unchanged, only escaped")
						assert.Contains(t, out, `\u001b[2J`)
						assert.Contains(t, out, `\u009b31m\u202eevil`)
					}
					continue
				}
				assert.Nil(t, doc.Memctl)
				assert.Contains(t, doc.Unknown["memctl"], tc.reason)
				assert.Len(t, doc.Unknown, 1)
				assert.Less(t, len(doc.Unknown["memctl"]), 1000, "the reason is cut")
			}
		})
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// memLimitDoc reads the state record's GOMEMLIMIT section of pid, failing
// t when status does not exit 0.
func memLimitDoc(t *testing.T, pid string) (statusReport, string) {
	t.Helper()
	out, _, code := result(t, memctl(t, nil, "status", "-json", "-pid", pid))
	require.Equal(t, 0, code, out)
	var doc statusReport
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	require.NotNil(t, doc.Memctl, "the record")
	table, _, code := result(t, memctl(t, nil, "status", "-pid", pid))
	require.Equal(t, 0, code, table)
	return doc, table
}

// TestStatusShowsFollowedLimitWhileIdle (issue 32 item 4): an idle process
// in a 512 MiB cgroup whose limit is written to 400 MiB: status shows the
// followed GOMEMLIMIT, not the one of the last GC end, within the
// limiter's bound for a written limit (at once where inotify sees it).
func TestStatusShowsFollowedLimitWhileIdle(t *testing.T) {
	g := cgrouptest.New(t, 512<<20)
	cmd := childtest.Command(t, "service", operatorVars)
	g.Wrap(cmd)
	pid := startReady(t, cmd)["PID"]
	file := "memory.limit_in_bytes"
	if g.Version == 2 {
		file = "memory.max"
	}
	require.NoError(t, os.WriteFile(filepath.Join(g.Dir, file), []byte(strconv.Itoa(400<<20)), 0))
	written := time.Now()
	const bound = 10 * time.Second // the limiter's bound: inotify at once, the refresh at the latest
	for {
		doc, table := memLimitDoc(t, pid)
		m := doc.Memctl.GoMemLimit
		if m.Bytes != nil && float64(*m.Bytes) <= 0.9*(400<<20) && m.MemoryLimitBytes == 400<<20 {
			t.Logf("%v after the write: %s", time.Since(written), table)
			assert.Contains(t, table, "400.0 MiB")
			return
		}
		require.True(t, time.Since(written) < bound, "status still shows %+v %v after the write", m, time.Since(written))
		time.Sleep(20 * time.Millisecond)
	}
}

// TestStatusShowsOperatorComparison (issue 32 item 2): the operator's
// GOMEMLIMIT above a 256 MiB cgroup's limit: status shows it beside the
// value memctl set over it.
func TestStatusShowsOperatorComparison(t *testing.T) {
	g := cgrouptest.New(t, 256<<20)
	cmd := childtest.Command(t, "service", operatorVars, "GOMEMLIMIT=300MiB")
	g.Wrap(cmd)
	pid := startReady(t, cmd)["PID"]
	doc, table := memLimitDoc(t, pid)
	m := doc.Memctl.GoMemLimit
	require.NotNil(t, m.OperatorBytes)
	assert.Equal(t, int64(300<<20), *m.OperatorBytes)
	assert.True(t, m.Overridden)
	require.NotNil(t, m.Bytes)
	assert.LessOrEqual(t, float64(*m.Bytes), 0.9*(256<<20))
	assert.Regexp(t, `the operator.s GOMEMLIMIT [0-9]+ bytes \(300.0 MiB\), above the hard limit`, table)
}
